"""A switch's catalog I/O in two round trips: ``BEGIN``, the alias's row locked and every fact
its gates need, in one pipeline of three statements; then the routing row, its history, its
event (and, for a rollback, the abandoned cutover plan) in one statement, pipelined with
``COMMIT``.

Each pipeline ends with its Sync, so that psycopg knows the transaction's status between the
two (a view's DDL in between takes savepoints of its own, see serving/views.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from orchestrator.catalog import versions
from orchestrator.catalog.db import qualified
from orchestrator.failpoints import fail_point
from orchestrator.models import DeployedVersion
from orchestrator.routing import Routing
from orchestrator.serving.switch_gates import SwitchFacts, Validation, VersionFacts
from orchestrator.states import RunState

# Every version of the job as deployed (versions.ROW_COLUMNS), then its run, its latest
# validation and the newest fresh lag sample of its current run; a version without a run has
# NULL facts.
_VERSIONS = """
SELECT {deployed},
       r.state, r.reason, r.started_at,
       val.against, val.passed, val.at, val.report -> 'guardrails',
       s.processed, s.log_end, extract(epoch FROM now() - s.at)
FROM {versions} v LEFT JOIN {logs} l ON l.version_id = v.id
LEFT JOIN {runs} r ON r.version_id = v.id
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


@dataclass(frozen=True)
class _Statements:
    """A switch's statements as bytes: composing them from identifiers at each switch cost
    about a third of the switch's client CPU, which under load is time to be preempted in."""

    lock_routing: bytes
    versions: bytes
    write: bytes


# By catalog schema and client encoding: identifiers escaped by any connection of one encoding
# give the same bytes.
_COMPOSED: dict[tuple[str, str], _Statements] = {}


def _statements(conn: psycopg.Connection, schema: str) -> _Statements:
    key = (schema, conn.info.encoding)
    found = _COMPOSED.get(key)
    if found is None:
        found = _COMPOSED[key] = _compose(conn, schema)
    return found


def _compose(conn: psycopg.Connection, schema: str) -> _Statements:
    return _Statements(
        lock_routing=sql.SQL(
            "SELECT primary_version, candidate_version, percent, rollback_version, "
            "view_versions FROM {} WHERE name = %s FOR UPDATE").format(
            qualified(schema, "aliases")).as_bytes(conn),
        versions=sql.SQL(_VERSIONS).format(
            deployed=sql.SQL(versions.ROW_COLUMNS),
            versions=qualified(schema, "job_versions"), logs=qualified(schema, "version_logs"),
            runs=qualified(schema, "runs"),
            validations=qualified(schema, "validations"),
            samples=qualified(schema, "lag_samples")).as_bytes(conn),
        write=sql.SQL(_WRITE).format(
            aliases=qualified(schema, "aliases"), history=qualified(schema, "alias_history"),
            plans=qualified(schema, "cutover_plans"),
            events=qualified(schema, "events")).as_bytes(conn))


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
    deployed, with its run, latest validation and newest fresh lag sample of its current run."""
    statements = _statements(conn, schema)
    with conn.pipeline():
        conn.execute("BEGIN")
        routing = conn.execute(statements.lock_routing, (alias,))
        facts = conn.execute(statements.versions,
                             {"job": job, "active": active, "age": max_age_s})
    # Fetched after the pipeline's end: a fetch inside it would be a round trip of its own.
    row, rows = routing.fetchone(), facts.fetchall()
    width = versions.ROW_WIDTH
    deployed = [versions.from_row(r[:width]) for r in rows]
    return SwitchFacts(
        # A job's row is written with its first version, and versions are never deleted.
        job=job, alias=alias, job_known=bool(deployed),
        routing=None if row is None else Routing(alias, row[0], row[1], row[2], row[3]),
        view_versions=tuple(row[4]) if row is not None else (),
        versions={v.version: _version(v, r[width:]) for v, r in zip(deployed, rows, strict=True)
                  if r[width] is not None},
        deployed={v.version: v for v in deployed})


def _version(deployed: DeployedVersion, facts: tuple[Any, ...]) -> VersionFacts:
    (state, reason, started_at, against, passed, at, guardrails, processed, log_end,
     age_s) = facts
    validation = None if against is None else Validation(against, passed, at, bool(guardrails))
    return VersionFacts(
        id=deployed.id, version=deployed.version, state=RunState(state), reason=reason,
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
        conn.execute(_statements(conn, schema).write, {
            "primary": after.primary, "candidate": after.candidate, "percent": after.percent,
            "rollback_to": after.rollback_to, "alias": after.alias,
            "view_versions": Jsonb(view_versions) if view_versions is not None else None,
            "job": job, "actor": actor, "action": action, "from_version": before.primary,
            "to_version": target, "history_percent": after.percent if action == "ab" else 100,
            "reason": reason, "forced": forced, "lag": Jsonb(lag), "abandon": abandon,
            "version": version, "kind": f"alias_{action}", "detail": Jsonb(detail)})
        # The write is sent (a pipeline sends each statement as it is queued) and runs in the
        # server: every lock the switch takes is held here until the COMMIT.
        fail_point("switch.before_commit")
        conn.execute("COMMIT")

