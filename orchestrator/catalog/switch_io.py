"""A switch's catalog I/O in two round trips: ``BEGIN``, the alias's row locked and every fact
its gates need, in one pipeline; then the routing row, its history, its event (and, for a
rollback, the abandoned cutover plan) in one statement, pipelined with ``COMMIT``.

Each pipeline ends with its Sync, so that psycopg knows the transaction's status between the
two (a view's DDL in between takes savepoints of its own, see aliases/views.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from orchestrator.catalog import versions
from orchestrator.catalog.db import qualified
from orchestrator.routing import Routing
from orchestrator.states import RunState
from orchestrator.switch_gates import SwitchFacts, Validation, VersionFacts

_VERSIONS = """
SELECT v.id, v.version, r.state, r.reason, r.started_at,
       val.against, val.passed, val.at, val.report -> 'guardrails',
       s.processed, s.log_end, extract(epoch FROM now() - s.at)
FROM {versions} v JOIN {runs} r ON r.version_id = v.id
LEFT JOIN {validations} val ON val.version_id = v.id
LEFT JOIN LATERAL (
    SELECT x.processed, x.log_end, x.at FROM {samples} x
    WHERE x.version_id = v.id AND r.state = ANY(%(active)s)
      AND x.at >= now() - make_interval(secs => %(age)s)
      AND (r.started_at IS NULL OR x.at >= r.started_at)
    ORDER BY x.at DESC LIMIT 1) s ON true
WHERE v.job = %(job)s ORDER BY v.id
"""

_WRITE = """
WITH saved AS (
    UPDATE {aliases} SET primary_version = %(primary)s, candidate_version = %(candidate)s,
        percent = %(percent)s, rollback_version = %(rollback_to)s,
        view_versions = COALESCE(%(view_versions)s, view_versions), updated_at = now()
    WHERE name = %(alias)s RETURNING name),
history AS (
    INSERT INTO {history} (alias, job, actor, action, from_version, to_version, percent,
                           reason, forced, lag)
    SELECT name, %(job)s, %(actor)s, %(action)s, %(from_version)s, %(to_version)s,
           %(history_percent)s, %(reason)s, %(forced)s, %(lag)s FROM saved),
abandoned AS (
    UPDATE {plans} SET status = 'rolled_back', reason = %(abandon)s, updated_at = now()
    WHERE %(abandon)s::text IS NOT NULL AND alias = %(alias)s AND status = 'running'
      AND EXISTS (SELECT FROM saved))
INSERT INTO {events} (actor, job, version, kind, detail)
SELECT %(actor)s, %(job)s, %(version)s, %(kind)s, %(detail)s FROM saved
"""


@contextmanager
def switch_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """The switch's transaction on an autocommit connection: ``read_locked`` sends its BEGIN,
    ``write`` its COMMIT; whatever is raised in between rolls it back."""
    try:
        yield
    finally:
        # A broken connection (status unknown) has no transaction left to end: the next
        # switch reopens it (CatalogAccess.kept).
        if conn.info.transaction_status in (TransactionStatus.INTRANS,
                                            TransactionStatus.INERROR):
            conn.execute("ROLLBACK")


def read_locked(conn: psycopg.Connection, schema: str, job: str, alias: str, *,
                active: list[str], max_age_s: float) -> SwitchFacts:
    """One round trip: BEGIN, the alias's row FOR UPDATE, and every version of ``job``: as
    deployed, and its run, latest validation and newest fresh lag sample of its current run."""
    with conn.pipeline():
        conn.execute("BEGIN")
        routing = conn.execute(sql.SQL(
            "SELECT primary_version, candidate_version, percent, rollback_version, "
            "view_versions FROM {} WHERE name = %s FOR UPDATE").format(
            qualified(schema, "aliases")), (alias,))
        known = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {} WHERE name = %s)").format(
            qualified(schema, "jobs")), (job,))
        deployed = conn.execute(versions.of_job_query(schema), (job,))
        rows = conn.execute(sql.SQL(_VERSIONS).format(
            versions=qualified(schema, "job_versions"), runs=qualified(schema, "runs"),
            validations=qualified(schema, "validations"),
            samples=qualified(schema, "lag_samples")),
            {"job": job, "active": active, "age": max_age_s})
    row = routing.fetchone()
    known_row = known.fetchone()
    return SwitchFacts(
        job=job, alias=alias, job_known=bool(known_row and known_row[0]),
        routing=None if row is None else Routing(alias, row[0], row[1], row[2], row[3]),
        view_versions=tuple(row[4]) if row is not None else (),
        versions={r[1]: _version(r) for r in rows.fetchall()},
        deployed={v.version: v for v in map(versions.from_row, deployed.fetchall())})


def _version(row: tuple[Any, ...]) -> VersionFacts:
    (id_, version, state, reason, started_at, against, passed, at, guardrails, processed,
     log_end, age_s) = row
    validation = None if against is None else Validation(against, passed, at, bool(guardrails))
    return VersionFacts(
        id=id_, version=version, state=RunState(state), reason=reason,
        started_at=started_at, validation=validation,
        sample_lag=None if processed is None else max(0, log_end - processed),
        sample_age_s=None if age_s is None else round(max(0.0, float(age_s)), 1))


def write(conn: psycopg.Connection, schema: str, *, job: str, actor: str, action: str,
          before: Routing, after: Routing, view_versions: list[str] | None,
          reason: str | None, forced: bool, lag: dict[str, int | None],
          lag_from: dict[str, str], version: str | None, abandon: str | None) -> None:
    """One round trip: the routing row, its history, its event and (``abandon``: a reason)
    the alias's running cutover plan marked rolled back, in one statement; then COMMIT."""
    target = after.candidate if action == "ab" else after.primary
    detail = {"alias": after.alias, "primary": after.primary, "candidate": after.candidate,
              "percent": after.percent, "reason": reason, "forced": forced,
              "lag_from": lag_from}
    with conn.pipeline():
        conn.execute(sql.SQL(_WRITE).format(
            aliases=qualified(schema, "aliases"), history=qualified(schema, "alias_history"),
            plans=qualified(schema, "cutover_plans"), events=qualified(schema, "events")), {
            "primary": after.primary, "candidate": after.candidate, "percent": after.percent,
            "rollback_to": after.rollback_to, "alias": after.alias,
            "view_versions": Jsonb(view_versions) if view_versions is not None else None,
            "job": job, "actor": actor, "action": action, "from_version": before.primary,
            "to_version": target, "history_percent": after.percent if action == "ab" else 100,
            "reason": reason, "forced": forced, "lag": Jsonb(lag), "abandon": abandon,
            "version": version, "kind": f"alias_{action}", "detail": Jsonb(detail)})
        conn.execute("COMMIT")

