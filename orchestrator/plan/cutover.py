"""`kappa cutover`: validate, then ramp with soaks and guardrails, as a resumable plan.

The plan and how far it has come are stored in the catalog after every stage, so running the
same command again after a crash continues from the last completed stage. Any failure rolls the
alias back and says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog import aliases, events
from orchestrator.catalog.access import CatalogAccess
from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError, ServiceUnavailableError, StateError
from orchestrator.experiment.design import ExperimentDesign
from orchestrator.lag import LagState, Thresholds
from orchestrator.models import VersionLag
from orchestrator.naming import validate_name
from orchestrator.plan.lag_wait import switch_when_lag_allows
from orchestrator.plan.stages import Experiment, Ramp, Stage, Validate, build, from_json, to_json
from orchestrator.serving.diff import DiffReport

Say = Callable[[str], None]


class SwitchService(Protocol):
    """What a cutover uses of the service: the catalog, lag, diffs and switches."""

    catalog: CatalogAccess

    def diff(self, job: str, version_a: str, version_b: str) -> DiffReport: ...

    def lag(self, job: str | None = None, version: str | None = None,
            limits: Thresholds | None = None) -> list[VersionLag]: ...

    def promote(self, job: str, version: str, alias: str | None = None, *, force: bool = False,
                reason: str | None = None) -> dict[str, Any]: ...

    def ab(self, job: str, version: str, percent: int, alias: str | None = None, *,
           reason: str | None = None, breaking: bool = False) -> dict[str, Any]: ...

    def rollback(self, job: str, alias: str | None = None, *, reason: str | None = None,
                 force: bool = False) -> dict[str, Any]: ...

_UNHEALTHY = {LagState.STALLED.value, LagState.STOPPED.value}


def describe(stage: Stage) -> str:
    if isinstance(stage, Validate):
        return "validate"
    if isinstance(stage, Ramp):
        return f"ramp to {stage.percent} %"
    if isinstance(stage, Experiment):
        return f"{stage.design.strategy.value} test on {', '.join(stage.design.metrics)}"
    return f"soak {stage.seconds:g}s"


class Cutover:
    def __init__(self, service: SwitchService, job: str, version: str, alias: str | None,
                 say: Say, *, pausing: bool = False, breaking: bool = False):
        self.service, self.say = service, say
        # The split may remove or retype columns (`kappa ab --breaking`).
        self.breaking = breaking
        # Return, rather than sleep, when the next step is an outcome test's look to come.
        self.pausing = pausing
        self.catalog = service.catalog
        self.job = validate_name(job, "job name")
        self.version = validate_name(version, "version")
        self.alias = validate_name(alias or job, "alias")
        self.schema = service.catalog.settings.catalog_schema
        self.plan_id = 0
        self.failed_with: str | None = None  # a resumed plan whose check had failed

    def run(self, ramp: list[int], soak_seconds: float) -> dict[str, Any]:
        return self._run(build(ramp, soak_seconds))

    def run_experiment(self, design: ExperimentDesign) -> dict[str, Any]:
        """Validate, then test by the readers' outcomes until a promote or a rollback. Its
        metrics are checked before the plan is made or anything switched."""
        from orchestrator.plan.experiment import ExperimentRunner

        ExperimentRunner(self, design).metrics()
        return self._run([Validate(), Experiment(design)])

    def _run(self, planned_stages: list[Stage]) -> dict[str, Any]:
        planned = self._plan(planned_stages)
        if planned is None:
            self.say(f"alias {self.alias} already serves {self.version} entirely: nothing to "
                     "cut over")
            return {"plan": None, "job": self.job, "version": self.version,
                    "alias": self.alias, "status": "already_serving", "steps": []}
        stages, start = planned
        if self.failed_with is not None:
            # A check failed, but rolling back did not finish (the catalog was unreachable):
            # finish it rather than resume the ramp.
            self._roll_back(self.failed_with)
            raise KappaError(f"cutover of {self.job} {self.version} rolled back; "
                             f"{self.failed_with}")
        for index in range(start, len(stages)):
            stage = stages[index]
            self._check_still_running()
            self.say(f"step {index + 1}/{len(stages)}: {describe(stage)}")
            try:
                next_look = self._visit(stage)
            except ServiceUnavailableError:
                raise  # the plan stays running: the same command resumes it once they are back
            except KappaError as exc:
                reason = f"step {index + 1} ({describe(stage)}) failed: {exc}"
                self._advance(None, "running", reason)  # in case the rollback fails too
                self._roll_back(reason)
                raise KappaError(f"cutover of {self.job} {self.version} rolled back; {reason}")\
                    from exc
            if next_look is not None:  # the plan runs on: the same call resumes it then
                self.say(f"the next look is due at {next_look.isoformat()}")
                return {"plan": self.plan_id, "job": self.job, "version": self.version,
                        "alias": self.alias, "status": "waiting",
                        "next_look_at": next_look.isoformat(),
                        "steps": [describe(s) for s in stages]}
            self._advance(index + 1, "succeeded" if index + 1 == len(stages) else "running")
        return {"plan": self.plan_id, "job": self.job, "version": self.version,
                "alias": self.alias, "status": "succeeded",
                "steps": [describe(s) for s in stages]}

    def _check_still_running(self) -> None:
        """Stop if someone rolled back or aborted this plan while it ran (a manual rollback
        during a soak must not be undone by the next ramp step)."""
        with self.catalog.connection() as conn:
            row = conn.execute(sql.SQL("SELECT status, reason FROM {} WHERE id = %s").format(
                qualified(self.schema, "cutover_plans")), (self.plan_id,)).fetchone()
        if row is not None and row[0] != "running":
            raise StateError(f"cutover plan {self.plan_id} of {self.job} {self.version} was "
                             f"{row[0]} while it ran ({row[1]}); start a new cutover to try "
                             "again")

    def abort(self, reason: str) -> int | None:
        """Roll back this version's unfinished cutover plan (its runner was killed or timed
        out, so it could not roll back itself); return the plan's id, or None if none runs."""
        with self.catalog.connection() as conn:
            row = conn.execute(sql.SQL(
                "SELECT id FROM {} WHERE alias = %s AND version = %s AND status = 'running'")
                .format(qualified(self.schema, "cutover_plans")),
                (self.alias, self.version)).fetchone()
        if row is None:
            return None
        self.plan_id = row[0]
        self._roll_back(reason)
        return self.plan_id

    # Stages --------------------------------------------------------------------------------
    def _visit(self, stage: Stage) -> datetime | None:
        """Run the stage; the instant of its next look if it pauses before then."""
        if isinstance(stage, Validate):
            self._validate()
        elif isinstance(stage, Ramp):
            self._ramp(stage.percent)
        elif isinstance(stage, Experiment):
            from orchestrator.plan.experiment import ExperimentRunner

            return ExperimentRunner(self, stage.design).run()
        else:
            self._soak(stage.seconds)
        return None

    def _serving(self) -> dict[str, Any]:
        with self.catalog.connection() as conn:
            info = aliases.find(conn, self.schema, self.alias)
        if info is None or info["primary"] is None:
            raise StateError(f"alias {self.alias} serves nothing yet: `kappa promote "
                             f"{self.job} VERSION` a first version")
        return info

    def _baseline(self) -> str:
        info = self._serving()
        if info["primary"] == self.version and info["rollback_to"]:
            return str(info["rollback_to"])
        return str(info["primary"])

    def _validate(self) -> None:
        baseline = self._baseline()
        if baseline == self.version:
            raise StateError(f"alias {self.alias} already serves {self.version}")
        report = self.service.diff(self.job, baseline, self.version)
        failed = [g.name + (f" ({g.detail})" if g.detail else "")
                  for g in report.guardrails if not g.passed]
        if failed:
            raise KappaError(f"guardrail(s) failed against {baseline}: {'; '.join(failed)}")

    def _ramp(self, percent: int) -> None:
        info = self._serving()
        done = (info["primary"] == self.version and not info["candidate"]) if percent == 100 \
            else (info["candidate"] == self.version and info["percent"] == percent)
        if done:  # the switch committed before a crash; the plan had not recorded it yet
            return
        reason = f"cutover plan {self.plan_id}: {percent} %"
        if percent == 100:
            switch_when_lag_allows(lambda: self.service.promote(
                self.job, self.version, self.alias, reason=reason), self.say)
        else:
            switch_when_lag_allows(lambda: self.service.ab(
                self.job, self.version, percent, self.alias, reason=reason,
                breaking=self.breaking), self.say)

    def _soak(self, seconds: float) -> None:
        baseline = self._baseline()
        deadline = time.monotonic() + seconds
        limits = Thresholds(window_s=max(5.0, min(30.0, seconds)))
        while True:
            self._check_still_running()
            for lag in self.service.lag(self.job, limits=limits):
                if lag.version in (baseline, self.version) and lag.state in _UNHEALTHY:
                    raise KappaError(f"{self.job} {lag.version} is {lag.state} during the soak")
            if time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        self._validate_against(baseline)

    def _validate_against(self, baseline: str) -> None:
        report = self.service.diff(self.job, baseline, self.version)
        failed = [g.name for g in report.guardrails if not g.passed]
        if failed:
            raise KappaError(f"guardrail(s) failed after the soak: {'; '.join(failed)}")

    def _roll_back(self, reason: str) -> None:
        info = None
        with self.catalog.connection() as conn:
            info = aliases.find(conn, self.schema, self.alias)
        touched = info is not None and self.version in (info["primary"], info["candidate"])
        if touched:
            # Forced: back to what served before the cutover is the safe side even when that
            # version stopped (the history records it as forced).
            self.service.rollback(self.job, self.alias, reason=reason, force=True)
            self.say(f"rolled back: {reason}")
        self._advance(None, "rolled_back", reason)

    # Plan bookkeeping ----------------------------------------------------------------------
    def _plan(self, stages: list[Stage]) -> tuple[list[Stage], int] | None:
        """The running plan of this alias to resume, or a new one; None when there is nothing
        to cut over (the alias serves the version entirely, and no plan runs)."""
        table = qualified(self.schema, "cutover_plans")
        with self.catalog.connection() as conn, conn.transaction():
            row = conn.execute(sql.SQL(
                "SELECT id, version, steps, next_step, reason FROM {} WHERE alias = %s "
                "AND status = 'running' FOR UPDATE").format(table), (self.alias,)).fetchone()
            if row is not None:
                plan_id, version, steps, next_step, self.failed_with = row
                if version != self.version or steps != to_json(stages):
                    raise StateError(
                        f"cutover plan {plan_id} of {self.job} {version} is still running on "
                        f"alias {self.alias} with steps {steps}: re-run it with the same "
                        "arguments to resume it")
                self.plan_id = plan_id
                self.say(f"resuming cutover plan {plan_id} at step {next_step + 1}")
                return from_json(steps), int(next_step)
            info = aliases.find(conn, self.schema, self.alias)
            if info is not None and info["primary"] == self.version and not info["candidate"]:
                return None
            created = conn.execute(sql.SQL(
                "INSERT INTO {} (job, alias, version, steps) VALUES (%s, %s, %s, %s) "
                "RETURNING id").format(table),
                (self.job, self.alias, self.version, Jsonb(to_json(stages)))).fetchone()
            assert created is not None
            self.plan_id = created[0]
            events.record(conn, self.schema, "cutover_plan", job=self.job,
                          version=self.version, plan=self.plan_id, steps=to_json(stages))
        return stages, 0

    def _advance(self, next_step: int | None, status: str, reason: str | None = None) -> None:
        with self.catalog.connection() as conn, conn.transaction():
            conn.execute(sql.SQL(
                "UPDATE {} SET next_step = COALESCE(%s, next_step), status = %s, reason = %s, "
                "updated_at = now() WHERE id = %s AND status = 'running'").format(
                qualified(self.schema, "cutover_plans")),
                (next_step, status, reason, self.plan_id))
            events.record(conn, self.schema, "cutover_step", job=self.job,
                          version=self.version, plan=self.plan_id, next_step=next_step,
                          status=status, reason=reason)


def running_plan(conn: psycopg.Connection, schema: str, alias: str) -> dict[str, Any] | None:
    row = conn.execute(sql.SQL(
        "SELECT id, version, next_step FROM {} WHERE alias = %s AND status = 'running'")
        .format(qualified(schema, "cutover_plans")), (alias,)).fetchone()
    return None if row is None else {"plan": row[0], "version": row[1], "next_step": row[2]}


def abandon(conn: psycopg.Connection, schema: str, alias: str, reason: str) -> None:
    """Mark the alias's running plan rolled back (its runner stops before its next step)."""
    with conn.transaction():
        conn.execute(sql.SQL(
            "UPDATE {} SET status = 'rolled_back', reason = %s, updated_at = now() "
            "WHERE alias = %s AND status = 'running'").format(
            qualified(schema, "cutover_plans")), (reason, alias))
