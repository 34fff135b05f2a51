"""Why a version may not be served now (pure: no driver library). A switch reads the facts
below under the alias's lock, in one round trip (serving/switch_io.py), and judges them here,
against the routing it locked: another switch may have changed the alias since the caller
looked."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.errors import NotFoundError
from orchestrator.log_identity import is_log_gone
from orchestrator.models import DeployedVersion
from orchestrator.routing import Routing
from orchestrator.states import RunState

SERVABLE = (RunState.CAUGHT_UP, RunState.LIVE)


@dataclass(frozen=True)
class Validation:
    against: str
    passed: bool
    at: datetime
    guarded: bool  # it ran at least one guardrail


@dataclass(frozen=True)
class VersionFacts:
    id: int
    version: str
    state: RunState
    reason: str | None
    started_at: datetime | None
    validation: Validation | None
    sample_lag: int | None = None  # from the newest fresh lag sample of the current run
    sample_age_s: float | None = None


@dataclass(frozen=True)
class SwitchFacts:
    """What a switch of ``alias`` reads under its lock: the routing (None: no alias yet) and
    every version of ``job``."""
    job: str
    alias: str
    job_known: bool
    routing: Routing | None
    view_versions: tuple[str, ...] = ()
    versions: dict[str, VersionFacts] = field(default_factory=dict)
    deployed: dict[str, DeployedVersion] = field(default_factory=dict)

    @property
    def live(self) -> dict[str, DeployedVersion]:
        """The versions not retired, by name."""
        return {name: v for name, v in self.deployed.items()
                if name in self.versions and self.versions[name].state != RunState.RETIRED}

    def version(self, name: str) -> VersionFacts:
        found = self.versions.get(name)
        if found is not None:
            return found
        if not self.job_known:
            raise NotFoundError(f"unknown job {self.job!r}: `kappa status` lists the deployed "
                                "jobs")
        raise NotFoundError(f"job {self.job!r} has no version {name!r}: `kappa status "
                            f"{self.job}` lists its versions")


def state_problems(job: str, v: VersionFacts) -> list[str]:
    """The version's run state, as recorded: a version that does not follow the log."""
    if is_log_gone(v.reason):
        return [f"it is {v.state.value}: the log it read is gone (`kappa status {job}` says "
                "why); deploy the job under a new VERSION"]
    if v.state == RunState.RETIRED:
        return [f"it is retired: its output stopped following the log for good; deploy the "
                f"job under a new VERSION, or promote another version of {job}"]
    if v.state in (RunState.STOPPED, RunState.FAILED):
        return [f"it is {v.state.value}, so its output no longer follows the log (`kappa "
                f"restart {job} {v.version}` resumes it; `kappa status {job}` says why)"]
    if v.state not in SERVABLE:
        return [f"it is {v.state.value}, not caught up (`kappa wait {job} {v.version}`)"]
    return []


def lag_problems(job: str, v: VersionFacts, lag: int | None, max_lag_records: int
                 ) -> list[str]:
    if lag is None:
        return ["its lag cannot be measured against the log now"]
    if lag > max_lag_records:
        return [f"it is {lag} records behind the log end (more than "
                f"max_lag_records={max_lag_records}; `kappa wait {job} {v.version}`)"]
    return []


def validation_problems(facts: SwitchFacts, v: VersionFacts, serving: str | None
                        ) -> list[str]:
    """A validation is current when it was made against what the alias serves (``serving``),
    after both versions' latest deploy or restart, with guardrails that ran and passed."""
    job, validation = facts.job, v.validation
    if validation is None:
        return [f"it has no validation (`kappa diff {job} {serving or 'OTHER'} {v.version}`)"]
    problems = []
    against = validation.against
    redo = f"`kappa diff {job} {serving or against} {v.version}`"
    if serving is not None and serving not in (v.version, against):
        problems.append(f"its latest validation is against {against}, not against {serving}, "
                        f"which the alias serves ({redo})")
    other = facts.versions.get(against)
    starts = [(v.version, v.started_at)] + ([(against, other.started_at)] if other else [])
    for name, started in starts:
        if started is not None and validation.at < started:
            problems.append(f"its validation predates the latest deploy or restart of {name} "
                            f"({redo})")
    if not validation.guarded:
        problems.append(f"its validation ran no guardrails ({v.version} declares none), so "
                        "nothing was checked")
    elif not validation.passed:
        problems.append(f"its latest validation against {against} failed ({redo})")
    return problems


def rollback_problem(facts: SwitchFacts, serving_schema: str, routing: Routing) -> str | None:
    """Why the version a rollback of ``routing`` would serve must not be served: its driver
    does not run (so its output stopped where it stopped), it was retired, or its log is
    gone."""
    job = facts.job
    target = routing.rollback().primary
    run = facts.versions.get(target or "")
    if run is None or run.state not in (RunState.STOPPED, RunState.FAILED, RunState.RETIRED):
        return None
    where = f"alias {serving_schema}.{routing.alias} would go back to {job} {target}"
    if is_log_gone(run.reason):
        return (f"{where}, whose log is gone (`kappa status {job}` says why): its output "
                "describes a log that no longer exists")
    if run.state == RunState.RETIRED:
        return (f"{where}, which is retired: its output stopped following the log for good. "
                f"Promote a version that runs (`kappa promote {job} VERSION`)")
    return (f"{where}, which is {run.state.value}: readers would get output that no longer "
            f"follows the log. `kappa restart {job} {target}` resumes it (then `kappa wait "
            f"{job} {target}` and roll back)")
