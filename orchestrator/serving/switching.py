"""Alias switches (promote, A/B, rollback), diffs and retirement: part of the service facade.

Every switch is one transaction: the alias's routing row is locked (so two switches of one alias
run one after the other), changed, and the change recorded in its history. A switch between
versions the alias view already has a branch for needs no DDL, so readers are never blocked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.catalog import aliases, events, runs, versions
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError, StateError
from orchestrator.models import DeployedVersion
from orchestrator.naming import stage_table, validate_name
from orchestrator.routing import Routing
from orchestrator.serving import columns, views
from orchestrator.serving.diff import DiffReport, compare
from orchestrator.settings import Settings
from orchestrator.spark.checkpoint import is_local, remove_local
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState

log = logging.getLogger("kappa.switching")

# Measures a version's lag against the broker now (None: it cannot be measured against the log).
MeasureNow = Callable[[DeployedVersion], int | None]


class Switchboard:
    def __init__(self, settings: Settings, conn: psycopg.Connection, measure_now: MeasureNow):
        self.s, self.conn, self.measure_now = settings, conn, measure_now
        self.breaking = False  # the A/B switch under way may remove columns

    # Switching: two round trips each (switch_flow.py) ------------------------------------------
    def promote(self, job: str, version: str, alias: str | None, *, force: bool,
                reason: str | None) -> dict[str, Any]:
        return self._switch(job, alias, "promote", version, lambda r: r.promote(version),
                            refuse=f"refusing to promote {job} {version}", force=force,
                            reason=reason)

    def ab(self, job: str, version: str, percent: int, alias: str | None, *,
           reason: str | None, breaking: bool = False) -> dict[str, Any]:
        """``breaking``: split even when the candidate removes columns (columns.py)."""
        self.breaking = breaking
        return self._switch(job, alias, "ab", version, lambda r: r.ab(version, percent),
                            refuse=f"refusing to serve {percent} % from {job} {version}",
                            force=False, reason=reason)

    def rollback(self, job: str, alias: str | None, *, reason: str | None,
                 force: bool = False, abandon: str | None = None) -> dict[str, Any]:
        """``abandon``: the reason recorded on the alias's running cutover plan, which stops."""
        return self._switch(job, alias, "rollback", None, lambda r: r.rollback(),
                            refuse="refusing to roll back", force=force, reason=reason,
                            abandon=abandon)

    def _switch(self, job: str, alias: str | None, action: str, target: str | None,
                change: Callable[[Routing], Routing], *, refuse: str, force: bool,
                reason: str | None, abandon: str | None = None) -> dict[str, Any]:
        from orchestrator.serving.switch_flow import SwitchRequest, run_switch

        job = validate_name(job, "job name")
        request = SwitchRequest(
            job=job, alias=validate_name(alias or job, "alias"), action=action,
            target=validate_name(target, "version") if target is not None else None,
            change=change, refuse=refuse, force=force, reason=reason, abandon=abandon)
        return run_switch(self, request)

    def prepare_view(self, job: str, alias: str, before: Routing, after: Routing,
                     view_versions: list[str],
                     live: dict[str, DeployedVersion] | None = None) -> list[str] | None:
        """Check a split that begins, and make sure the view has a branch for every version
        the routing serves; return the view's new version list when it had to be
        (re)defined, else None (no DDL)."""
        begins = after.candidate is not None and after.candidate != before.candidate
        leaves = (before.serves() - after.serves()) & set(view_versions)
        in_view = after.serves() <= set(view_versions)
        if in_view and not begins and not leaves:
            return None
        deployed = live if live is not None else \
            {v.version: v for v in self._live_versions(job)}
        primary = deployed.get(after.primary) if after.primary else None
        candidate = deployed.get(after.candidate) if after.candidate else None
        if in_view and not begins:
            # A version left: only one that does not fit beside the primary (a --breaking
            # split ended) takes DDL, so that the columns get the primary's types back. A
            # primary retired since (a forced rollback) keeps the view it has.
            if primary is None or all(columns.fits(primary, deployed[v])
                                      for v in leaves if v in deployed):
                return None
        else:
            if primary is None or (after.candidate and candidate is None):
                raise StateError(f"{job} {after.primary if primary is None else after.candidate}"
                                 " is retired: it cannot be served")
            if candidate is not None and begins:
                columns.check_split(primary, candidate, breaking=self.breaking)
            if in_view:
                return None
        assert primary is not None
        branch = self._branch(primary, deployed, candidate)
        views.define_view(self.conn, catalog_schema=self.s.catalog_schema,
                          data_schema=self.s.data_schema, serving_schema=self.s.serving_schema,
                          reader_role=self.s.reader_role, alias=alias, versions=branch,
                          version_column=self.s.alias_version_column)
        return [v.version for v in branch]

    @staticmethod
    def _branch(primary: DeployedVersion, deployed: dict[str, DeployedVersion],
                candidate: DeployedVersion | None) -> list[DeployedVersion]:
        """The versions one view serves: the primary first, the candidate (which may not fit,
        in a --breaking split), then every live version that fits beside each of those already
        in (columns.py), so that switching to any of them needs no DDL."""
        branch = [primary] if candidate in (None, primary) else [primary, candidate]
        for v in deployed.values():
            # Beside every version already in: two versions that add one column with two
            # types would otherwise make it text for all.
            if v not in branch and all(columns.fits(w, v) for w in branch):
                branch.append(v)
        return branch

    def refresh_views(self, job: str) -> None:
        """After a deploy: give every alias of the job a branch for a new compatible version,
        so that switching to it later needs no DDL, and a view of an older form this form."""
        schema = self.s.catalog_schema
        for name in aliases.for_job(self.conn, schema, job):
            with self.conn.transaction():
                locked = aliases.lock(self.conn, schema, name)
                if locked is None or locked[0].primary is None:
                    continue
                routing, view_versions = locked
                deployed = {v.version: v for v in self._live_versions(job)}
                primary = deployed.get(routing.primary) if routing.primary else None
                if primary is None:
                    continue
                candidate = deployed.get(routing.candidate) if routing.candidate else None
                branch = self._branch(primary, deployed, candidate)
                if {v.version for v in branch} <= set(view_versions) and not views.outdated(
                        self.conn, self.s.serving_schema, name):
                    continue
                views.define_view(self.conn, catalog_schema=schema,
                                  data_schema=self.s.data_schema,
                                  serving_schema=self.s.serving_schema,
                                  reader_role=self.s.reader_role, alias=name, versions=branch,
                                  version_column=self.s.alias_version_column)
                aliases.save(self.conn, schema, routing, [v.version for v in branch])

    # Validation ----------------------------------------------------------------------------
    def diff(self, job: str, version_a: str, version_b: str) -> DiffReport:
        a, b = self._version(job, version_a), self._version(job, version_b)
        report = compare(self.conn, self.s.catalog_schema, self.s.data_schema, a, b)
        with self.conn.transaction():
            aliases.store_validation(self.conn, self.s.catalog_schema, b.id, a.version,
                                     report.passed, report.to_json())
            events.record(self.conn, self.s.catalog_schema, "validation", job=job,
                          version=b.version, against=a.version, passed=report.passed,
                          aligned=report.aligned, offsets_apart=report.offsets_apart)
        return report

    # Retirement ----------------------------------------------------------------------------
    def retire(self, job: str, version: str, *, drop: bool) -> dict[str, Any]:
        target = self._version(job, version)
        schema = self.s.catalog_schema
        with self.conn.transaction():
            # Under the aliases' locks: a promote of this version waits for the retirement,
            # then finds it retired; a retire that waits for a promote sees what it serves.
            for name in aliases.for_job(self.conn, schema, job):
                locked = aliases.lock(self.conn, schema, name)
                assert locked is not None
                routing = locked[0]
                if version in (routing.primary, routing.candidate):
                    raise StateError(f"alias {self.s.serving_schema}.{name} serves {job} "
                                     f"{version}: promote another version (or roll back) "
                                     "before retiring it")
                if drop and routing.rollback_to == version:
                    raise StateError(f"alias {self.s.serving_schema}.{name} would roll back to "
                                     f"{version}: promote again or retire without --drop")
            run = runs.get(self.conn, schema, target.id, for_update=True)
            if run.state.is_active:
                run = runs.change_state(self.conn, schema, target, RunState.STOPPED,
                                        expected=run.as_seen(),
                                        reason="stopped by `kappa retire`") or run
            if run.state != RunState.RETIRED:
                runs.change_state(self.conn, schema, target, RunState.RETIRED,
                                  expected=run.as_seen(),
                                  reason="retired" + (" and dropped" if drop else ""))
        # After the commit: the driver finds its run ended at its next heartbeat anyway.
        launcher.stop_driver(run)
        if drop:
            self._drop(job, target)
        return {"job": job, "version": version, "state": RunState.RETIRED.value,
                "dropped": drop}

    def _drop(self, job: str, target: DeployedVersion) -> None:
        schema = self.s.catalog_schema
        for name in aliases.for_job(self.conn, schema, job):
            with self.conn.transaction():
                locked = aliases.lock(self.conn, schema, name)
                if locked is None or target.version not in locked[1]:
                    continue
                routing, view_versions = locked
                keep = sorted((v for v in self._live_versions(job)
                               if v.version in view_versions and v.version != target.version),
                              key=lambda v: v.version != routing.primary)  # the primary first
                if keep:
                    views.define_view(self.conn, catalog_schema=schema,
                                      data_schema=self.s.data_schema,
                                      serving_schema=self.s.serving_schema,
                                      reader_role=self.s.reader_role, alias=name,
                                      versions=keep, version_column=self.s.alias_version_column)
                aliases.save(self.conn, schema, routing, [v.version for v in keep])
        with self.conn.transaction():
            self.conn.execute("SET LOCAL lock_timeout = '5s'")
            for table in (target.output_table, target.dead_letter_table,
                          stage_table(job, target.version)):
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                    qualified(self.s.data_schema, table)))
            for stage in ("dead_letter_stage", "read_stage"):
                self.conn.execute(sql.SQL("DELETE FROM {} WHERE version_id = %s").format(
                    qualified(schema, stage)), (target.id,))
            local = is_local(target.checkpoint_dir)
            events.record(self.conn, schema, "drop", job=job, version=target.version,
                          tables=[target.output_table, target.dead_letter_table],
                          checkpoint=target.checkpoint_dir, checkpoint_removed=local)
        if local:
            remove_local(target.checkpoint_dir)
        else:
            log.warning("the checkpoint %s is not on this host's file system: remove it with "
                        "its own tools", target.checkpoint_dir)

    # Helpers -------------------------------------------------------------------------------
    def _version(self, job: str, version: str) -> DeployedVersion:
        return versions.get(self.conn, self.s.catalog_schema, validate_name(job, "job name"),
                            validate_name(version, "version"))

    def _run_state(self, v: DeployedVersion) -> RunState:
        return runs.get(self.conn, self.s.catalog_schema, v.id).state

    def _live_versions(self, job: str) -> list[DeployedVersion]:
        return [v for v in versions.list_all(self.conn, self.s.catalog_schema, job)
                if runs.get(self.conn, self.s.catalog_schema, v.id).state != RunState.RETIRED]

    def history(self, job: str, alias: str | None) -> list[dict[str, Any]]:
        validate_name(job, "job name")
        return aliases.history(self.conn, self.s.catalog_schema, job,
                               validate_name(alias, "alias") if alias else None)


__all__ = ["KappaError", "Switchboard"]
