"""The replay budget as the service offers it: the queue with each version's wait and ETA, and
handing out the slots that freed, and live first's hold (the agent does both at every
sample)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.catalog.access import CatalogAccess
from orchestrator.models import QueueKeeper, ReplayHold, VersionLag
from orchestrator.replay_queue import keeper as queue_keeper
from orchestrator.replay_queue import pausing, slots
from orchestrator.versions import reporting


class ReplayDesk:
    def __init__(self, catalog: CatalogAccess):
        self.catalog = catalog

    def queue(self) -> list[dict[str, Any]]:
        """The catch-ups holding replay slots, then the queued versions in the order they get
        one, each with its records to replay, its wait for a slot and its ETA (None: unknown)."""
        return slots.listing(self.catalog, lambda job, version: reporting.lag(
            self.catalog, job, version))

    def counts(self) -> tuple[int, int, int | None]:
        """(catch-ups holding a slot, versions queued, slots; None: no budget)."""
        return slots.counts(self.catalog)

    @staticmethod
    def keeper_name(what: str) -> str:
        """How a process that looks at the queue at a steady interval is named (host, pid)."""
        return queue_keeper.keeper_name(what)

    def schedule(self, keeper: tuple[str, float] | None = None) -> list[tuple[str, str]]:
        """Start the queued versions that free slots allow; (job, version) of each.
        ``keeper``: (who, interval in seconds) of a process that looks at a steady interval."""
        return slots.schedule(self.catalog, keeper)

    def keep(self, every_s: float, stop: Callable[[], bool], say: Callable[[str], None]
             ) -> None:
        """Keep the queue until ``stop()``: every ``every_s`` seconds, free the slots of
        catch-ups whose driver is gone and hand out the free slots (`kappa queue keep`)."""
        queue_keeper.keep(self.catalog, every_s, stop, say)

    def keepers(self) -> list[QueueKeeper]:
        """The processes that hand out slots at a steady interval, and how long since each
        looked: `kappa queue` names them, or says that nobody does."""
        return slots.keepers(self.catalog)

    def hold(self) -> ReplayHold | None:
        """Live first's hold on the queue, if a live version is too far behind."""
        return slots.hold(self.catalog)

    def protect_live(self, lags: Sequence[VersionLag], interval_s: float) -> bool:
        """Hold the queue, and pause catch-ups, while a live version in ``lags`` is more than
        half of live_lag_protect_s behind; end the hold once all are back under a quarter of
        it. Whether the queue is held after this look."""
        return pausing.protect_live(self.catalog, lags, interval_s)
