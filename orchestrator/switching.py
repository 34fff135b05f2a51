"""Alias switches (promote, A/B, rollback), diffs and retirement: part of the service facade.

Every switch is one transaction: the alias's routing row is locked (so two switches of one alias
run one after the other), changed, and the change recorded in its history. A switch between
versions the alias view already has a branch for needs no DDL, so readers are never blocked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from orchestrator.aliases import columns, views
from orchestrator.aliases.diff import DiffReport, compare
from orchestrator.catalog import aliases, events, lag_history, runs, versions
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError, StateError
from orchestrator.models import DeployedVersion
from orchestrator.naming import stage_table, validate_name
from orchestrator.routing import Routing
from orchestrator.settings import Settings
from orchestrator.spark import launcher
from orchestrator.spark.checkpoint import is_local, remove_local
from orchestrator.states import RunState
from orchestrator.switch_gates import rollback_problem, state_problems, validation_problems

log = logging.getLogger("kappa.switching")

# Measures a version's lag against the broker now (None: it cannot be measured against the log).
MeasureNow = Callable[[DeployedVersion], int | None]


@dataclass(frozen=True)
class SwitchLag:
    """A version's lag as a switch judges and records it, and where the figure came from:
    ``sample`` (the latest lag sample of the current run), ``broker`` (measured for this switch,
    before any lock) or ``none`` (neither: a rollback never waits for the broker)."""

    records: int | None
    source: str
    age_s: float | None = None


class Switchboard:
    def __init__(self, settings: Settings, conn: psycopg.Connection, measure_now: MeasureNow):
        self.s, self.conn, self.measure_now = settings, conn, measure_now
        self._gated: dict[str, SwitchLag] = {}
        self.breaking = False  # the A/B switch under way may remove columns

    def lags_of(self, job: str, names: set[str], *, ask_broker: bool = True
                ) -> dict[str, SwitchLag]:
        """From the agent's (or `kappa lag`'s) latest samples when fresh and of the current run,
        read in one statement, so that a switch costs no broker round trip; else from the
        broker, when allowed."""
        wanted = sorted(names)
        samples = lag_history.fresh_samples(
            self.conn, self.s.catalog_schema, job, wanted,
            active=[state.value for state in RunState if state.is_active],
            max_age_s=self.s.lag_sample_max_age_s)
        now = time.time()
        lags = {}
        for name in wanted:
            sample = samples.get(name)
            if sample is not None:
                lags[name] = SwitchLag(sample.lag_records, "sample",
                                       round(max(0.0, now - sample.at), 1))
                continue
            deployed = versions.find(self.conn, self.s.catalog_schema, job, name) \
                if ask_broker else None
            lags[name] = SwitchLag(self.measure_now(deployed), "broker") if deployed \
                else SwitchLag(None, "none")
        return lags

    # Switching -----------------------------------------------------------------------------
    def promote(self, job: str, version: str, alias: str | None, *, force: bool,
                reason: str | None) -> dict[str, Any]:
        self._gated.clear()
        target = self._version(job, version)
        problems = self._not_ready(target, alias)
        refuse = f"refusing to promote {job} {version}"
        if problems and not force:
            raise StateError(f"{refuse}: {'; '.join(problems)}; or override with --force "
                             "--reason TEXT")
        return self._switch(job, alias, "promote", target, lambda r: r.promote(version),
                            reason=reason, forced=bool(problems and force),
                            recheck=self._recheck(target, refuse, force=force))

    def ab(self, job: str, version: str, percent: int, alias: str | None, *,
           reason: str | None, breaking: bool = False) -> dict[str, Any]:
        """``breaking``: split even when the candidate removes columns (columns.py)."""
        self._gated.clear()
        self.breaking = breaking
        target = self._version(job, version)
        problems = self._not_ready(target, alias)
        refuse = f"refusing to serve {percent} % from {job} {version}"
        if problems:
            raise StateError(f"{refuse}: {'; '.join(problems)}")
        return self._switch(job, alias, "ab", target, lambda r: r.ab(version, percent),
                            reason=reason, forced=False,
                            recheck=self._recheck(target, refuse, force=False))

    def rollback(self, job: str, alias: str | None, *, reason: str | None,
                 force: bool = False) -> dict[str, Any]:
        self._gated.clear()
        name = validate_name(alias or job, "alias")
        current = aliases.find(self.conn, self.s.catalog_schema, name)
        problem = None if current is None else rollback_problem(  # else _switch says why
            self.conn, self.s, job, Routing(name, current["primary"], current["candidate"],
                                            current["percent"] or 0, current["rollback_to"]))
        if problem and not force:
            raise StateError(f"refusing to roll back: {problem}; or override with --force "
                             "--reason TEXT")

        def recheck(locked: Routing) -> tuple[list[str], bool]:
            again = rollback_problem(self.conn, self.s, job, locked)
            if again and not force:
                raise StateError(f"refusing to roll back: {again}; or override with --force "
                                 "--reason TEXT")
            return [again] if again else [], bool(again)

        return self._switch(job, alias, "rollback", None, lambda r: r.rollback(), reason=reason,
                            forced=bool(problem and force), recheck=recheck)

    def _recheck(self, target: DeployedVersion, refuse: str, *, force: bool
                 ) -> Callable[[Routing], tuple[list[str], bool]]:
        """The gates again, under the alias's lock: the state recorded now, and a validation
        against what the locked alias serves (another switch may have changed it since)."""
        def recheck(locked: Routing) -> tuple[list[str], bool]:
            problems = state_problems(self.conn, self.s, target) + validation_problems(
                self.conn, self.s, target, locked.primary)
            if problems and not force:
                raise StateError(f"{refuse}: {'; '.join(problems)}"
                                 + ("; or override with --force --reason TEXT"
                                    if refuse.startswith("refusing to promote") else ""))
            return problems, bool(problems)

        return recheck

    def _switch(self, job: str, alias: str | None, action: str,
                target: DeployedVersion | None, change: Any, *, reason: str | None,
                forced: bool, recheck: Callable[[Routing], tuple[list[str], bool]]
                ) -> dict[str, Any]:
        from orchestrator.catalog.events import actor

        name = validate_name(alias or job, "alias")
        if forced and not reason:
            raise StateError("--force needs --reason TEXT, which is recorded in the history")
        schema = self.s.catalog_schema
        # Lags need the broker: measure them before the routing row is locked, so that a switch
        # holds its lock for milliseconds.
        current = aliases.find(self.conn, schema, name)
        involved = {v for v in (current["primary"], current["candidate"],
                                current["rollback_to"]) if v} if current else set()
        if target is not None:
            involved.add(target.version)
        # A promote or A/B step was gated on its target's lag just before: reuse that figure.
        lag = dict(self._gated)
        lag.update(self.lags_of(job, involved - set(lag), ask_broker=action != "rollback"))
        with self.conn.transaction():
            locked = aliases.lock(self.conn, schema, name)
            if locked is None:
                if action != "promote":
                    raise StateError(f"alias {name} does not exist yet: `kappa promote {job} "
                                     "VERSION` creates it")
                aliases.create(self.conn, schema, name, job, self.s.serving_schema)
                locked = aliases.lock(self.conn, schema, name)
            assert locked is not None
            before, view_versions = locked
            _, overridden = recheck(before)
            if overridden and not forced:
                forced = True
                if not reason:
                    raise StateError("--force needs --reason TEXT, which is recorded in the "
                                     "history")
            after: Routing = change(before)
            new_view = self._prepare_view(job, name, before, after, view_versions)
            aliases.save(self.conn, schema, after, new_view)
            # Another switch changed the alias meanwhile: no broker round trip under the lock.
            others = (before.serves() | after.serves()) - set(lag)
            if others:
                lag.update(self.lags_of(job, others, ask_broker=False))
            aliases.record_switch(self.conn, schema, alias=name, job=job, actor=actor(),
                                  action=action, before=before, after=after, reason=reason,
                                  forced=forced, lag={v: x.records for v, x in lag.items()})
            events.record(self.conn, schema, f"alias_{action}", job=job,
                          version=target.version if target else after.primary, alias=name,
                          primary=after.primary, candidate=after.candidate,
                          percent=after.percent, reason=reason, forced=forced,
                          lag_from={v: x.source for v, x in lag.items()})
        return {"alias": f"{self.s.serving_schema}.{name}", "primary": after.primary,
                "candidate": after.candidate, "percent": after.percent,
                "rollback_to": after.rollback_to, "view_redefined": new_view is not None}

    def _prepare_view(self, job: str, alias: str, before: Routing, after: Routing,
                      view_versions: list[str]) -> list[str] | None:
        """Check a split that begins, and make sure the view has a branch for every version
        the routing serves; return the view's new version list when it had to be
        (re)defined, else None (no DDL)."""
        begins = after.candidate is not None and after.candidate != before.candidate
        leaves = (before.serves() - after.serves()) & set(view_versions)
        in_view = after.serves() <= set(view_versions)
        if in_view and not begins and not leaves:
            return None
        deployed = {v.version: v for v in self._live_versions(job)}
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
        so that switching to it later needs no DDL."""
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
                if {v.version for v in branch} <= set(view_versions):
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
            run = runs.get(self.conn, schema, target.id)
            if run.state.is_active:
                runs.change_state(self.conn, schema, target, RunState.STOPPED,
                                  reason="stopped by `kappa retire`")
            if run.state != RunState.RETIRED:
                runs.change_state(self.conn, schema, target, RunState.RETIRED,
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

    def _not_ready(self, v: DeployedVersion, alias: str | None) -> list[str]:
        """Why ``v`` may not be served now: its state, its *measured* lag, and a validation that
        is current (see switch_gates); checked again under the alias's lock."""
        problems = state_problems(self.conn, self.s, v)
        if not problems:
            job = v.job
            measured = self.lags_of(job, {v.version})[v.version]
            if measured.source == "sample" and (measured.records or 0) > self.s.max_lag_records:
                # A sample may admit a version; only a measurement now may refuse it (it may
                # have caught up since the sample).
                measured = SwitchLag(self.measure_now(v), "broker")
            self._gated[v.version] = measured
            lag = measured.records
            if lag is None:
                problems.append("its lag cannot be measured against the log now")
            elif lag > self.s.max_lag_records:
                problems.append(f"it is {lag} records behind the log end (more than "
                                f"max_lag_records={self.s.max_lag_records}; `kappa wait {job} "
                                f"{v.version}`)")
        current = aliases.find(self.conn, self.s.catalog_schema,
                               validate_name(alias or v.job, "alias"))
        return problems + validation_problems(self.conn, self.s, v,
                                              current["primary"] if current else None)

    def _live_versions(self, job: str) -> list[DeployedVersion]:
        return [v for v in versions.list_all(self.conn, self.s.catalog_schema, job)
                if runs.get(self.conn, self.s.catalog_schema, v.id).state != RunState.RETIRED]

    def history(self, job: str, alias: str | None) -> list[dict[str, Any]]:
        validate_name(job, "job name")
        return aliases.history(self.conn, self.s.catalog_schema, job,
                               validate_name(alias, "alias") if alias else None)


__all__ = ["KappaError", "Switchboard"]
