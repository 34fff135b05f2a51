"""The replay budget as the service offers it: the queue with each version's wait and ETA, and
handing out the slots that freed, and live first's hold (the agent does both at every
sample)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.catalog.access import CatalogAccess
from orchestrator.models import ReplayHold, VersionLag
from orchestrator.versions import budget, protection, reporting


class ReplayDesk:
    def __init__(self, catalog: CatalogAccess):
        self.catalog = catalog

    def queue(self) -> list[dict[str, Any]]:
        """The catch-ups holding replay slots, then the queued versions in the order they get
        one, each with its records to replay, its wait for a slot and its ETA (None: unknown)."""
        return budget.listing(self.catalog, lambda job, version: reporting.lag(
            self.catalog, job, version))

    def counts(self) -> tuple[int, int, int | None]:
        """(catch-ups holding a slot, versions queued, slots; None: no budget)."""
        return budget.counts(self.catalog)

    def schedule(self) -> list[tuple[str, str]]:
        """Start the queued versions that free slots allow; (job, version) of each."""
        return budget.schedule(self.catalog)

    def hold(self) -> ReplayHold | None:
        """Live first's hold on the queue, if a live version is too far behind."""
        return budget.hold(self.catalog)

    def protect_live(self, lags: Sequence[VersionLag], interval_s: float) -> bool:
        """Hold the queue, and pause catch-ups, while a live version in ``lags`` is more than
        half of live_lag_protect_s behind; end the hold once all are back under a quarter of
        it. Whether the queue is held after this look."""
        return protection.protect_live(self.catalog, lags, interval_s)
