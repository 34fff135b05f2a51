"""The read aliases as the service offers them: switches on a kept connection, their history,
diffs, retiring, and what an alias serves. The switch rules themselves are in
serving/switching.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from orchestrator.catalog import aliases as alias_rows
from orchestrator.catalog import runs
from orchestrator.catalog.access import CatalogAccess
from orchestrator.failpoints import FailPointUnreachableError, fail_point
from orchestrator.lag import lag_against, log_mismatches
from orchestrator.models import AliasState, DeployedVersion
from orchestrator.naming import validate_name
from orchestrator.observe import monitor
from orchestrator.serving.diff import DiffReport
from orchestrator.serving.switching import Switchboard


class SwitchDesk:
    def __init__(self, catalog: CatalogAccess):
        self.catalog = catalog
        self.settings = catalog.settings

    def board(self, conn: psycopg.Connection) -> Switchboard:
        s = self.settings

        def measure_now(deployed: DeployedVersion) -> int | None:
            try:
                fail_point("switch.measure_lag")
            except FailPointUnreachableError:
                return None  # as a broker that did not answer within the timeout
            processed = runs.processed_offsets(conn, s.catalog_schema, deployed.id)
            bounds = monitor.bounds_of(s, deployed, conn)
            if bounds is None or log_mismatches(processed or deployed.log_start, bounds):
                return None  # no lag against a log the version did not read
            # After the bounds: a broker that cannot answer them costs no second timeout.
            if monitor.log_gone(deployed, monitor.current_identity(
                    s, list(deployed.spec.topics))):
                return None
            return lag_against(processed or deployed.log_start, bounds)

        return Switchboard(s, conn, measure_now)

    @contextmanager
    def switching(self) -> Iterator[Switchboard]:
        """A switchboard on the catalog's kept connection. One switch at a time."""
        with self.catalog.kept() as conn:
            yield self.board(conn)

    def promote(self, job: str, version: str, alias: str | None, *, force: bool,
                reason: str | None) -> dict[str, Any]:
        with self.switching() as board:
            return board.promote(job, version, alias, force=force, reason=reason)

    def ab(self, job: str, version: str, percent: int, alias: str | None, *,
           reason: str | None, breaking: bool = False) -> dict[str, Any]:
        with self.switching() as board:
            return board.ab(job, version, percent, alias, reason=reason, breaking=breaking)

    def rollback(self, job: str, alias: str | None, *, reason: str | None, force: bool
                 ) -> dict[str, Any]:
        """Back to what the alias served before; refused when that version is stopped or
        failed, unless ``force`` (with a ``reason``, recorded)."""
        with self.switching() as board:
            # A cutover still ramping this alias must not carry on over the rollback: its plan
            # stops in the rollback's own statement.
            return board.rollback(job, alias, reason=reason, force=force,
                                  abandon=reason or "rolled back")

    def aliases(self) -> list[AliasState]:
        with self.catalog.connection() as conn:
            return [AliasState(*row) for row in alias_rows.overview(
                conn, self.settings.catalog_schema)]

    def serving(self, job: str, alias: str | None) -> AliasState | None:
        """What the alias (by default named after the job) serves, or None if it does not
        exist yet."""
        name = validate_name(alias or job, "alias")
        return next((a for a in self.aliases() if a.alias == name), None)

    def history(self, job: str, alias: str | None) -> list[dict[str, Any]]:
        with self.catalog.connection() as conn:
            return self.board(conn).history(job, alias)

    def diff(self, job: str, version_a: str, version_b: str) -> DiffReport:
        with self.catalog.connection() as conn:
            return self.board(conn).diff(job, version_a, version_b)

    def retire(self, job: str, version: str, *, drop: bool) -> dict[str, Any]:
        with self.catalog.connection() as conn:
            return self.board(conn).retire(job, version, drop=drop)

    def cutover_in_progress(self, job: str, alias: str | None) -> dict[str, Any] | None:
        """The alias's unfinished cutover plan ({"plan", "version", "next_step"}), if any."""
        from orchestrator.plan.cutover import running_plan

        with self.catalog.connection() as conn:
            return running_plan(conn, self.settings.catalog_schema,
                                validate_name(alias or job, "alias"))
