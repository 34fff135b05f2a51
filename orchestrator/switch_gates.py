"""Why a version may not be served now: the checks a switch makes before it takes the alias's
lock, and makes again under it, against the routing it locked (another switch may have changed
the alias in between)."""

from __future__ import annotations

import psycopg

from orchestrator.catalog import aliases, runs, versions
from orchestrator.log_identity import is_log_gone
from orchestrator.models import DeployedVersion
from orchestrator.routing import Routing
from orchestrator.settings import Settings
from orchestrator.states import RunState

SERVABLE = (RunState.CAUGHT_UP, RunState.LIVE)


def state_problems(conn: psycopg.Connection, s: Settings, v: DeployedVersion) -> list[str]:
    """The version's run state, as recorded: a version that does not follow the log."""
    run = runs.get(conn, s.catalog_schema, v.id)
    job = v.job
    if is_log_gone(run.reason):
        return [f"it is {run.state.value}: the log it read is gone (`kappa status {job}` says "
                "why); deploy the job under a new VERSION"]
    if run.state == RunState.RETIRED:
        return [f"it is retired: its output stopped following the log for good; deploy the "
                f"job under a new VERSION, or promote another version of {job}"]
    if run.state in (RunState.STOPPED, RunState.FAILED):
        return [f"it is {run.state.value}, so its output no longer follows the log (`kappa "
                f"restart {job} {v.version}` resumes it; `kappa status {job}` says why)"]
    if run.state not in SERVABLE:
        return [f"it is {run.state.value}, not caught up (`kappa wait {job} {v.version}`)"]
    return []


def validation_problems(conn: psycopg.Connection, s: Settings, v: DeployedVersion,
                        serving: str | None) -> list[str]:
    """A validation is current when it was made against what the alias serves (``serving``),
    after both versions' latest deploy or restart, with guardrails that ran and passed."""
    schema, job = s.catalog_schema, v.job
    validation = aliases.latest_validation(conn, schema, v.id)
    if validation is None:
        return [f"it has no validation (`kappa diff {job} {serving or 'OTHER'} {v.version}`)"]
    problems = []
    against, passed, at, report = validation
    redo = f"`kappa diff {job} {serving or against} {v.version}`"
    if serving is not None and serving not in (v.version, against):
        problems.append(f"its latest validation is against {against}, not against {serving}, "
                        f"which the alias serves ({redo})")
    other = versions.find(conn, schema, job, against)
    starts = [(v.version, runs.get(conn, schema, v.id).started_at)]
    if other is not None:
        starts.append((against, runs.get(conn, schema, other.id).started_at))
    for name, started in starts:
        if started is not None and at < started:
            problems.append(f"its validation predates the latest deploy or restart of {name} "
                            f"({redo})")
    if not (report or {}).get("guardrails"):
        problems.append(f"its validation ran no guardrails ({v.version} declares none), so "
                        "nothing was checked")
    elif not passed:
        problems.append(f"its latest validation against {against} failed ({redo})")
    return problems


def rollback_problem(conn: psycopg.Connection, s: Settings, job: str, routing: Routing
                     ) -> str | None:
    """Why the version a rollback of ``routing`` would serve must not be served: its driver
    does not run (so its output stopped where it stopped), it was retired, or its log is
    gone."""
    target = routing.rollback().primary
    deployed = versions.find(conn, s.catalog_schema, job, target or "")
    if deployed is None:
        return None
    run = runs.get(conn, s.catalog_schema, deployed.id)
    if run.state not in (RunState.STOPPED, RunState.FAILED, RunState.RETIRED):
        return None
    where = f"alias {s.serving_schema}.{routing.alias} would go back to {job} {target}"
    if is_log_gone(run.reason):
        return (f"{where}, whose log is gone (`kappa status {job}` says why): its output "
                "describes a log that no longer exists")
    if run.state == RunState.RETIRED:
        return (f"{where}, which is retired: its output stopped following the log for good. "
                f"Promote a version that runs (`kappa promote {job} VERSION`)")
    return (f"{where}, which is {run.state.value}: readers would get output that no longer "
            f"follows the log. `kappa restart {job} {target}` resumes it (then `kappa wait "
            f"{job} {target}` and roll back)")
