"""Operators for each step of a reprocessing, each a thin call into the orchestrator's facade.

Errors: a KappaError that retrying cannot fix (a failed guardrail, a bad name, a wrong state)
fails the task at once with its message; one that may pass (a service that is down) is an
ordinary failure that the task's retries get to try again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from orchestrator.airflow.hooks import KAFKA_CONN_ID, POSTGRES_CONN_ID, KappaHook

if TYPE_CHECKING:
    from orchestrator.service import Orchestrator

_CONNECTION_FIELDS = ("postgres_conn_id", "kafka_conn_id", "project_dir")
_RECHECK_S = 0.5  # the shortest deferral between an outcome test's looks


@contextmanager
def failing_clearly() -> Iterator[None]:
    from orchestrator.errors import KappaError, LaunchError, ServiceUnavailableError

    try:
        yield
    except (ServiceUnavailableError, LaunchError) as exc:
        raise AirflowException(str(exc)) from exc
    except KappaError as exc:
        raise AirflowFailException(str(exc)) from exc


def run_reason(context: Mapping[str, Any], what: str) -> str:
    return f"{what} (Airflow {context['dag'].dag_id} run {context['run_id']})"


class KappaBaseOperator(BaseOperator):
    """Shared arguments: where the catalog and the broker are, and the project directory that
    relative job files and kappa.toml are found in."""

    def __init__(self, *, postgres_conn_id: str = POSTGRES_CONN_ID,
                 kafka_conn_id: str = KAFKA_CONN_ID, project_dir: str | None = None,
                 kappa_settings: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.postgres_conn_id, self.kafka_conn_id = postgres_conn_id, kafka_conn_id
        self.project_dir, self.kappa_settings = project_dir, dict(kappa_settings or {})

    def hook(self) -> KappaHook:
        return KappaHook(self.postgres_conn_id, self.kafka_conn_id, self.project_dir,
                         self.kappa_settings)

    def service(self) -> Orchestrator:
        return self.hook().service()


class KappaDeployOperator(KappaBaseOperator):
    """Deploy a job file: register the version, create its tables, start its replay.

    Idempotent by the file's fingerprint: a retried or re-run task finds the same code already
    deployed and deploys nothing (a version left stopped or failed is restarted from its
    checkpoint instead, when ``restart_stopped``). The same label with other code is refused.
    """

    template_fields: Sequence[str] = ("job_file", "expect_version", "expect_fingerprint",
                                      "priority", "allow_incompatible")

    def __init__(self, *, job_file: str, restart_stopped: bool = True,
                 expect_version: str | None = None, expect_fingerprint: str | None = None,
                 priority: int | str = 0, allow_incompatible: Any = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.job_file, self.restart_stopped = job_file, restart_stopped
        self.expect_version, self.expect_fingerprint = expect_version, expect_fingerprint
        self.priority = priority  # its place in the replay queue (kappa deploy --priority)
        self.allow_incompatible = allow_incompatible  # kappa deploy --allow-incompatible

    def execute(self, context: Any) -> dict[str, Any]:
        from orchestrator.jobspec import load_job_file
        from orchestrator.states import RunState

        with failing_clearly():
            spec = load_job_file(self.job_file)
            expected = (self.expect_version or spec.version,
                        self.expect_fingerprint or spec.fingerprint)
            if (spec.version, spec.fingerprint) != expected:
                # The later tasks of this run wait on and switch to what was checked.
                raise AirflowFailException(
                    f"{self.job_file} changed since this run checked it (now {spec.version}, "
                    f"{spec.fingerprint[:19]}; checked {expected[0]}, {expected[1][:19]}): "
                    "trigger a new run")
            service = self.service()
            result = service.deploy(
                spec.path, priority=self.priority,
                allow_incompatible=self.allow_incompatible in (True, "True", "true"))
            status = result.status
            if result.created:
                self.log.info("deployed %s %s (fingerprint %s): replaying into %s",
                              spec.name, spec.version, spec.fingerprint[:12], status.output_table)
            else:
                self.log.info("%s %s with this code is already deployed (%s): nothing to deploy",
                              spec.name, spec.version, status.state.value)
                if self.restart_stopped and status.state in (RunState.STOPPED, RunState.FAILED):
                    self.log.info("restarting it from its checkpoint")
                    status = service.restart(spec.name, spec.version)
        return {"job": spec.name, "version": spec.version, "fingerprint": spec.fingerprint,
                "created": result.created, "state": status.state.value,
                "attempt": status.attempt, "output_table": status.output_table}


class KappaValidateOperator(KappaBaseOperator):
    """Diff the version against the one its alias serves, guardrails included; fail on any
    failed guardrail. With nothing served yet there is nothing to compare: the task says so."""

    template_fields: Sequence[str] = ("job", "version", "alias")

    def __init__(self, *, job: str, version: str, alias: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.version, self.alias = job, version, alias

    def execute(self, context: Any) -> dict[str, Any]:
        with failing_clearly():
            service = self.service()
            serving = service.serving(self.job, self.alias or None)
            if serving is None or serving.primary is None:
                self.log.info("alias %s serves nothing yet: no version to validate against",
                              self.alias or self.job)
                return {"baseline": None, "passed": True, "guardrails": []}
            if serving.primary == self.version and serving.candidate is None:
                self.log.info("alias %s already serves %s", serving.alias, self.version)
                return {"baseline": self.version, "passed": True, "guardrails": []}
            report = service.diff(self.job, serving.primary, self.version)
            summary = {
                "baseline": serving.primary, "passed": report.passed,
                "verdict": report.verdict,
                "rows": {serving.primary: report.rows_a, self.version: report.rows_b},
                "only_in_baseline": report.only_in_a, "only_in_new": report.only_in_b,
                "differing": report.differing, "offsets_apart": report.offsets_apart,
                "guardrails": [{"name": g.name, "passed": g.passed, "detail": g.detail}
                               for g in report.guardrails],
            }
            self.log.info("%s against %s: %s", self.version, serving.primary, summary)
            failed = [g.name + (f" ({g.detail})" if g.detail else "")
                      for g in report.guardrails if not g.passed]
            if failed:
                raise AirflowFailException(
                    f"validation of {self.job} {self.version} against {serving.primary} failed: "
                    f"guardrail(s) {'; '.join(failed)}; the alias was not touched")
            return summary


class KappaCutoverOperator(KappaBaseOperator):
    """Ramp the alias to the version step by step, soaking and re-checking guardrails after
    each step, then promote; any failed check rolls back and fails the task with the reason.

    The plan is stored in the catalog, so a retried task resumes where the last one stopped.
    The first version of a job (its alias serves nothing) is promoted directly.
    """

    template_fields: Sequence[str] = ("job", "version", "ramp", "soak_seconds", "alias",
                                      "experiment", "breaking")

    def __init__(self, *, job: str, version: str, ramp: Any = (10, 50, 100),
                 soak_seconds: Any = 60, alias: str | None = None, experiment: Any = None,
                 breaking: Any = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.version, self.alias = job, version, alias
        self.ramp, self.soak_seconds = ramp, soak_seconds
        # An outcome cutover's design (ExperimentDesign.to_json()) instead of the ramp: the
        # task defers between its looks, holding no worker slot.
        self.experiment = experiment
        self.breaking = breaking  # the split may remove or retype columns

    def execute_complete(self, context: Any, event: Any = None) -> dict[str, Any]:
        """The next look is due: the same call resumes the plan from the catalog."""
        return self.execute(context)

    def execute(self, context: Any) -> dict[str, Any]:
        from orchestrator.experiment.design import ExperimentDesign
        from orchestrator.states import RunState

        alias = self.alias or None
        with failing_clearly():
            service = self.service()
            serving = service.serving(self.job, alias)
            if serving is None or serving.primary is None:
                state = service.version_status(self.job, self.version).state
                if state not in (RunState.CAUGHT_UP, RunState.LIVE):
                    raise AirflowFailException(f"{self.job} {self.version} is {state.value}, "
                                               "not caught up: it cannot be served")
                # Nothing to validate against, so the missing validation is overridden, and
                # the history says why.
                switched = service.promote(
                    self.job, self.version, alias, force=True,
                    reason=run_reason(context, "first version: nothing served to validate "
                                               "against"))
                self.log.info("promoted the first version: %s", switched)
                return {"previous": None, "status": "promoted", "alias": switched["alias"]}
            unfinished = service.cutover_in_progress(self.job, alias)
            if unfinished is None and serving.primary == self.version and \
                    serving.candidate is None:
                self.log.info("alias %s already serves %s: nothing to switch", serving.alias,
                              self.version)
                return {"previous": serving.rollback_to, "status": "unchanged",
                        "alias": serving.alias}
            # After a retry the switch to this version may have committed already.
            previous = serving.rollback_to if serving.primary == self.version \
                else serving.primary
            design = ExperimentDesign.from_json(self.experiment) if self.experiment else None
            result = service.cutover(self.job, self.version,
                                     ramp=[int(p) for p in self.ramp],
                                     soak_seconds=float(self.soak_seconds),
                                     alias=alias, say=self.log.info, experiment=design,
                                     pausing=design is not None,
                                     breaking=self.breaking in (True, "True", "true"))
        if result["status"] == "waiting":
            from datetime import UTC, datetime, timedelta

            from airflow.providers.standard.triggers.temporal import DateTimeTrigger

            # The look is due by the database's clock; a worker's clock ahead of it would
            # otherwise wake the task again at once until the database's caught up.
            soonest = datetime.now(UTC) + timedelta(seconds=_RECHECK_S)
            due = max(datetime.fromisoformat(result["next_look_at"]), soonest)
            self.defer(trigger=DateTimeTrigger(moment=due), method_name="execute_complete")
        return {"previous": previous, "status": result["status"], "plan": result["plan"],
                "steps": result["steps"], "alias": result["alias"]}

    def on_kill(self) -> None:
        """Killed mid-ramp (a timeout, the run marked failed): undo the unfinished plan now.
        Once: a second SIGTERM lands while the first's rollback waits on the catalog, and a
        rollback started inside it would wait on the first's own locks for good."""
        if getattr(self, "_rolling_back", False):
            return
        self._rolling_back = True
        try:
            plan = self.service().abort_cutover(
                self.job, self.version, reason=f"the {self.task_id} task was killed",
                alias=self.alias or None)
        except Exception as exc:  # the teardown task tries again
            self.log.warning("could not roll back on kill (%s)", exc)
        else:
            self.log.info("killed: %s", "no unfinished cutover" if plan is None
                          else f"rolled back cutover plan {plan}")


class KappaRollbackOperator(KappaBaseOperator):
    """Serve the previous version again.

    With ``version``, only undo that version's unfinished cutover (a safety net for a cutover
    task that was killed or timed out before it could roll back by itself); otherwise roll the
    alias back, whatever it serves.
    """

    template_fields: Sequence[str] = ("job", "version", "alias", "reason", "force")

    def __init__(self, *, job: str, version: str | None = None, alias: str | None = None,
                 reason: str | None = None, force: bool | str = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.version, self.alias, self.reason = job, version, alias, reason
        self.force = force  # also to a version that is stopped or failed; recorded as forced

    def execute(self, context: Any) -> dict[str, Any]:
        if not self.job:
            raise AirflowSkipException("no job to roll back: the run failed before it named one")
        reason = run_reason(context, self.reason or "rollback")
        with failing_clearly():
            service = self.service()
            if self.version:
                plan = service.abort_cutover(self.job, self.version, reason=reason,
                                             alias=self.alias or None)
                if plan is None:
                    self.log.info("no unfinished cutover of %s %s: nothing to roll back",
                                  self.job, self.version)
                else:
                    self.log.info("rolled back cutover plan %s of %s %s", plan, self.job,
                                  self.version)
                return {"rolled_back_plan": plan}
            # A rendered template gives "True"/"False"; bool("False") would force.
            force = self.force is True or str(self.force).lower() == "true"
            switched = service.rollback(self.job, self.alias or None, reason=reason, force=force)
            self.log.info("rolled back: %s", switched)
            return switched


class KappaRetireOperator(KappaBaseOperator):
    """Stop a version that no alias serves and mark it retired; with ``drop``, also drop its
    tables and checkpoint. Skips when not ``enabled`` or when ``version`` renders empty."""

    template_fields: Sequence[str] = ("job", "version", "drop", "enabled")

    def __init__(self, *, job: str, version: str | None, drop: Any = False,
                 enabled: Any = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.version, self.drop, self.enabled = job, version, drop, enabled

    def execute(self, context: Any) -> dict[str, Any]:
        if not _true(self.enabled):
            raise AirflowSkipException("retiring was not asked for")
        if not self.version or self.version == "None":
            raise AirflowSkipException(f"no previous version of {self.job} to retire")
        drop = _true(self.drop)
        with failing_clearly():
            result = self.service().retire(self.job, self.version, drop=drop)
        self.log.info("retired: %s", result)
        return result


def _true(value: Any) -> bool:
    """A flag that may arrive rendered as text by Jinja."""
    return value is True or str(value).lower() == "true"
