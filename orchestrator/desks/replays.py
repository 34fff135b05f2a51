"""The replay budget as the service offers it: the queue with each version's wait and ETA, and
handing out the slots that freed (the agent does so at every sample)."""

from __future__ import annotations

from typing import Any

from orchestrator.catalog.access import CatalogAccess
from orchestrator.versions import budget, reporting


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
