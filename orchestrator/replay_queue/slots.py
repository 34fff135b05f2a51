"""The replay budget: at most ``replay_slots`` catch-ups at once, the rest wait in a queue.

A deploy over the budget registers its version and queues it; whoever looks next hands out the
slots that freed: the agent at every sample, and any process waiting for a version that is
queued (`kappa deploy --wait`, `kappa wait`, the Airflow trigger). One catalog lock makes them
take turns, so two of them never start the same version.

A slot is claimed in one transaction and its driver launched after the commit. Until the
driver's PID is recorded the claiming process holds the run's claim lock: if it dies in between
(the fail point ``queue.after_claim``), the next look finds the lock free and puts the version
back in the queue, where it keeps its place; it is started once, by whoever looks next."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

import psycopg

from orchestrator.catalog import events, runs, versions
from orchestrator.catalog.access import CatalogAccess
from orchestrator.errors import KappaError
from orchestrator.failpoints import fail_point
from orchestrator.models import DeployedVersion, QueueKeeper, ReplayHold, RunRecord
from orchestrator.replay_queue import queries as queue
from orchestrator.replay_queue.launching import claim_attempt, launch_claimed
from orchestrator.replay_queue.order import median_rate, queue_estimates
from orchestrator.states import RunState

log = logging.getLogger("kappa.queue")

REQUEUED = ("the process that took its replay slot died before it launched the driver: back "
            "in the queue, in its place")


def start_or_queue(catalog: CatalogAccess, conn: psycopg.Connection, version: DeployedVersion,
                   priority: int, queued_at: datetime | None = None) -> bool:
    """Start a version's catch-up now if a slot is free, the queue is not held and no queued
    version comes first (True), else queue it (False). ``queued_at``: its place, kept when it
    was in the queue before (a restart)."""
    s = catalog.settings
    schema, budget = s.catalog_schema, s.replay_budget
    joined = queued_at or datetime.now(UTC)
    with conn.transaction():
        queue.lock_queue(conn, schema)
        hold = queue.current_hold(conn, schema)
        if hold is not None or (budget is not None and (
                queue.holding_slots(conn, schema) >= budget
                or queue.outranked(conn, schema, version.id, priority, joined))):
            run = runs.get(conn, schema, version.id, for_update=True)
            if run.state != RunState.QUEUED:
                runs.change_state(conn, schema, version, RunState.QUEUED, priority=priority,
                                  queued_at=joined, reason=_why_queued(hold, budget),
                                  expected=run.as_seen())
            return False
        attempt = claim_attempt(conn, schema, version, priority=priority, queued_at=None)
    launch_claimed(s, conn, version, attempt)
    return True


def _why_queued(hold: ReplayHold | None, budget: int | None) -> str:
    if hold is not None:
        return f"held by live first: {hold.reason}"
    return f"waiting for a replay slot (replay_slots={budget})"


def schedule(catalog: CatalogAccess, keeper: tuple[str, float] | None = None
             ) -> list[tuple[str, str]]:
    """Hand the free slots to the queued versions, in order; (job, version) of each started.
    ``keeper``: (who, every how many seconds) of a process that looks at a steady interval,
    noted so that the queue can say whether anyone hands slots out."""
    s = catalog.settings
    schema, budget = s.catalog_schema, s.replay_budget
    claimed: list[tuple[DeployedVersion, int]] = []
    with catalog.connection() as conn:
        with conn.transaction():
            queue.lock_queue(conn, schema)
            if keeper is not None:
                queue.note_look(conn, schema, *keeper)
            _requeue_unlaunched(conn, schema)
            if queue.current_hold(conn, schema) is not None:
                return []  # a live version is too far behind: nothing starts
            free = None if budget is None else budget - queue.holding_slots(conn, schema)
            if free is not None and free <= 0:
                return []
            line = queue.next_in_line(conn, schema, free)
            if line:
                fail_point("queue.claiming")
            for version_id in line:
                version = versions.by_id(conn, schema, version_id)
                queue.hold_claim(conn, schema, version_id)
                claimed.append((version, claim_attempt(conn, schema, version)))
                events.record(conn, schema, "replay_slot", job=version.job,
                              version=version.version, slots=budget)
        if claimed:
            fail_point("queue.after_claim")
        for version, attempt in claimed:
            try:
                launch_claimed(s, conn, version, attempt)
                log.info("started %s %s from the replay queue", version.job, version.version)
            except KappaError as exc:  # recorded failed with the reason; the others go on
                log.warning("%s", exc)
            finally:
                queue.release_claim(conn, schema, version.id)
    return [(v.job, v.version) for v, _ in claimed]


def counts(catalog: CatalogAccess) -> tuple[int, int, int | None]:
    with catalog.connection() as conn:
        holding, queued = queue.counts(conn, catalog.settings.catalog_schema)
    return holding, queued, catalog.settings.replay_budget


def keepers(catalog: CatalogAccess) -> list[QueueKeeper]:
    with catalog.connection() as conn:
        return queue.keepers(conn, catalog.settings.catalog_schema)


def hold(catalog: CatalogAccess) -> ReplayHold | None:
    with catalog.connection() as conn:
        return queue.current_hold(conn, catalog.settings.catalog_schema)


def waiting(catalog: CatalogAccess, job: str, version: str) -> str | None:
    """Where a queued version stands, after handing out any free slot; None once it started."""
    schedule(catalog)
    s = catalog.settings
    with catalog.connection() as conn:
        deployed = versions.get(conn, s.catalog_schema, job, version)
        place = queue.place_of(conn, s.catalog_schema, deployed.id)
        held = queue.current_hold(conn, s.catalog_schema)
    if place is None:
        return None
    where = f"place {place[0]} of {place[1]} in the replay queue"
    if held is not None:
        return (f"{where}, held by live first: {held.reason}; it starts once every live "
                "version is back under a quarter of live_lag_protect_s")
    return (f"{where} (replay_slots={s.replay_budget}); it starts when a catch-up before it "
            "is done")


def _requeue_unlaunched(conn: psycopg.Connection, schema: str) -> None:
    for version_id in queue.unlaunched_claims(conn, schema):
        requeue_if_abandoned(conn, schema, versions.by_id(conn, schema, version_id))


def requeue_if_abandoned(conn: psycopg.Connection, schema: str, version: DeployedVersion
                         ) -> RunRecord | None:
    """Put a run the queue started back in the queue if the process that claimed its slot died
    before recording the driver's PID (in the caller's transaction); the run as it is now, or
    None if it is not such a run."""
    if not queue.claimer_gone(conn, schema, version.id):
        return None  # its claimer is launching it right now
    # Read after the lock: a claimer records the PID before it lets the lock go.
    run = runs.get(conn, schema, version.id, for_update=True)
    if run.state != RunState.STARTING or run.pid is not None or run.queued_at is None:
        return None
    return runs.change_state(conn, schema, version, RunState.QUEUED, reason=REQUEUED,
                             expected=run.as_seen())


def listing(catalog: CatalogAccess, measure: Any) -> list[dict[str, Any]]:
    """Every catch-up holding a slot, then every queued version, with its place, records to
    replay and ETA, which for a queued one includes its wait for a slot. ``measure(job,
    version)`` gives a version's lag (the facade's ``lag``)."""
    s = catalog.settings
    with catalog.connection() as conn:
        rows = queue.entries(conn, s.catalog_schema)
        held = queue.current_hold(conn, s.catalog_schema) is not None
    lags = {(job, version): measure(job, version)[0] for job, version, *_ in rows}
    holding = [r for r in rows if r[2] != RunState.QUEUED.value]
    waiting = [r for r in rows if r[2] == RunState.QUEUED.value]
    rate = median_rate([lags[(j, v)].processing_rate for j, v, *_ in holding])
    estimates = queue_estimates([lags[(j, v)].eta_seconds for j, v, *_ in holding],
                                s.replay_budget, [lags[(j, v)].lag_records
                                                  for j, v, *_ in waiting], rate, held=held)
    now = datetime.now(UTC)
    result = []
    for place, (job, version, state, priority, queued_at, started_at) in enumerate(rows):
        lag = lags[(job, version)]
        wait, eta = ((0.0, lag.eta_seconds) if state != RunState.QUEUED.value
                     else estimates[place - len(holding)])
        result.append({
            "job": job, "version": version, "state": state, "priority": priority,
            "place": place - len(holding) + 1 if state == RunState.QUEUED.value else None,
            "queued_for_s": _age(now, queued_at) if state == RunState.QUEUED.value else None,
            "replaying_for_s": _age(now, started_at) if state != RunState.QUEUED.value else None,
            "lag_records": lag.lag_records, "wait_s": _rounded(wait), "eta_s": _rounded(eta)})
    return result


def _age(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else round((now - since).total_seconds(), 1)


def _rounded(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else round(value, 1)
