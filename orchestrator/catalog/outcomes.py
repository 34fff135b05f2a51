"""Outcome metrics in the catalog, their observations read from the application's tables, and
the looks of outcome cutovers.

A metric's SQL is the operator's text: it runs only inside a READ ONLY transaction with a
statement timeout, wrapped so that exactly the columns ``key``, ``value`` and ``observed_at``
are read, and its ``{since}`` placeholder becomes a bound parameter. Observations are credited
to the arm that served their key when they were observed, in SQL: the routing spans arrive as
arrays, and a key's bucket is computed as the catalog's ``key_bucket()`` computes it, so the
query needs nothing of the catalog in the application's database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError, NotFoundError, StateError
from orchestrator.experiment.attribution import RoutingSpan, span_after
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
from orchestrator.experiment.sequential import NOTHING, ArmSummary, Stratum

COLUMNS = ("key", "value", "observed_at")
_NUMERIC_OIDS = {20, 21, 23, 700, 701, 1700}  # int8/2/4, float4/8, numeric
_TIME_OIDS = {1114, 1184, 1082}  # timestamp, timestamptz, date


# Declarations ---------------------------------------------------------------------------------
def define(conn: psycopg.Connection, schema: str, job: str, metric: OutcomeMetric) -> bool:
    """Insert or replace; True when it replaced a definition."""
    row = conn.execute(sql.SQL(
        "INSERT INTO {} AS m (job, name, kind, higher_is_better, role, margin, query_sql, "
        "query_promql, query_promql_count, query_promql_squares) VALUES (%s, %s, %s, %s, %s, "
        "%s, %s, %s, %s, %s) ON CONFLICT (job, name) DO "
        "UPDATE SET kind = EXCLUDED.kind, higher_is_better = EXCLUDED.higher_is_better, "
        "role = EXCLUDED.role, margin = EXCLUDED.margin, query_sql = EXCLUDED.query_sql, "
        "query_promql = EXCLUDED.query_promql, query_promql_count = "
        "EXCLUDED.query_promql_count, query_promql_squares = EXCLUDED.query_promql_squares, "
        "defined_at = now() RETURNING (xmax <> 0)").format(qualified(schema, "outcome_metrics")),
        (job, metric.name, metric.kind.value, metric.higher_is_better, metric.role.value,
         metric.margin, metric.sql, metric.promql, metric.promql_count,
         metric.promql_squares)).fetchone()
    return bool(row and row[0])


def drop(conn: psycopg.Connection, schema: str, job: str, name: str) -> bool:
    gone = conn.execute(sql.SQL("DELETE FROM {} WHERE job = %s AND name = %s").format(
        qualified(schema, "outcome_metrics")), (job, name))
    return gone.rowcount > 0


def listed(conn: psycopg.Connection, schema: str, job: str | None
           ) -> list[tuple[str, OutcomeMetric]]:
    rows = conn.execute(sql.SQL(
        "SELECT job, name, kind, higher_is_better, role, margin, query_sql, query_promql, "
        "query_promql_count, query_promql_squares FROM {} "
        "WHERE (%(job)s::text IS NULL OR job = %(job)s) ORDER BY job, name").format(
        qualified(schema, "outcome_metrics")), {"job": job}).fetchall()
    return [(r[0], _stored(*r)) for r in rows]


def _stored(job: str, name: str, kind: str, higher: bool, role: str, margin: float,
            *queries: str | None) -> OutcomeMetric:
    try:
        return OutcomeMetric(name, Kind(kind), higher, Role(role), margin, *queries)
    except StateError as exc:  # a PromQL metric stored before it needed --promql-count
        raise StateError(f"{exc} (stored for {job}): define it again with `kappa metric define "
                         f"{job} {name} ...`, or `kappa metric drop {job} {name}`") from exc


def resolve(conn: psycopg.Connection, schema: str, job: str, names: Sequence[str]
            ) -> list[OutcomeMetric]:
    """The job's metrics by name, in the order given; one line for any unknown."""
    known = {m.name: m for _, m in listed(conn, schema, job)}
    missing = [n for n in names if n not in known]
    if missing:
        raise NotFoundError(f"no outcome metric {', '.join(missing)} for {job}: define it with "
                            f"`kappa metric define {job} NAME --sql ...` (`kappa metric list "
                            f"{job}` shows what is defined)")
    return [known[n] for n in names]


# Observations ---------------------------------------------------------------------------------
def _observations(metric: OutcomeMetric) -> sql.Composable:
    """The metric's query as a subquery of exactly (key text, value float8, observed_at)."""
    assert metric.sql is not None
    text = metric.sql.strip().rstrip(";").replace("%", "%%").replace("{since}", "%(since)s")
    return sql.Composed([
        sql.SQL("SELECT m.key::text AS key, m.value::float8 AS value, "
                "m.observed_at::timestamptz AS observed_at FROM ("),
        sql.SQL(text),  # type: ignore[arg-type]  # the operator's own query, read only
        sql.SQL(") AS m"),
    ])


def _read_only(conn: psycopg.Connection, timeout_ms: int) -> None:
    conn.execute("SET TRANSACTION READ ONLY")
    conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(
        sql.Literal(f"{int(timeout_ms)}ms")))


def probe(conn: psycopg.Connection, metric: OutcomeMetric, *, since: datetime,
          timeout_ms: int) -> None:
    """Run the metric's query once, reading no row, to refuse before anything is switched a
    query with a syntax error, other columns, or one that writes."""
    assert metric.sql is not None
    where = f"metric {metric.name}"
    text = metric.sql.strip().rstrip(";").replace("%", "%%").replace("{since}", "%(since)s")
    try:
        with conn.transaction():
            _read_only(conn, timeout_ms)
            cur = conn.execute(sql.Composed([sql.SQL("SELECT * FROM ("),
                                             sql.SQL(text),  # type: ignore[arg-type]
                                             sql.SQL(") AS m LIMIT 0")]), {"since": since})
            found = [(c.name, c.type_code) for c in cur.description or []]
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise StateError(f"{where}: its SQL writes ({first_line(exc)}); it must be one SELECT "
                         "that changes nothing") from exc
    except psycopg.Error as exc:
        raise StateError(f"{where}: its SQL fails: {first_line(exc)}; fix it and run "
                         "`kappa metric define` again") from exc
    names = [name for name, _ in found]
    if sorted(names) != sorted(COLUMNS):
        raise StateError(f"{where}: its SQL must return exactly the columns key, value and "
                         f"observed_at (alias them with AS), not {', '.join(names) or 'none'}")
    types = dict(found)
    if types["value"] not in _NUMERIC_OIDS:
        raise StateError(f"{where}: its value column must be a number (0/1 for a "
                         "proportion): cast it, e.g. converted::int AS value")
    if types["observed_at"] not in _TIME_OIDS:
        raise StateError(f"{where}: its observed_at column must be a timestamp, cast it with "
                         "::timestamptz")


def strata(conn: psycopg.Connection, metric: OutcomeMetric, spans: Sequence[RoutingSpan], *,
           baseline: str, candidate: str, since: datetime, until: datetime, timeout_ms: int
           ) -> list[Stratum]:
    """Per span of the routing since ``since`` (spans that serve neither arm count for none),
    the (baseline, candidate) summaries of the observations before ``until``, each credited to
    the arm that served its key at its ``observed_at``."""
    if not spans:
        return []
    stops = [s.start for s in spans[1:]] + [until]
    bucket = sql.SQL("(('x' || substr(md5(o.key), 1, 8))::bit(32)::bigint %% 100)")
    query = sql.SQL(
        "WITH spans AS (SELECT * FROM unnest(%(starts)s::timestamptz[], %(stops)s::timestamptz[], "
        "%(primaries)s::text[], %(candidates)s::text[], %(percents)s::int[]) WITH ORDINALITY "
        "AS s(start, stop, primary_version, candidate_version, percent, n)), "
        "o AS ({observations}), "
        "credited AS (SELECT s.n, CASE WHEN s.candidate_version IS NOT NULL AND {bucket} < "
        "s.percent THEN s.candidate_version ELSE s.primary_version END AS arm, o.value "
        "FROM o JOIN spans s ON o.observed_at >= s.start AND o.observed_at < s.stop "
        "WHERE o.key IS NOT NULL AND o.value IS NOT NULL) "
        "SELECT n, arm, count(*), sum(value), coalesce(var_samp(value), 0) * (count(*) - 1) "
        "FROM credited WHERE arm IN (%(baseline)s, %(candidate)s) GROUP BY n, arm").format(
        observations=_observations(metric), bucket=bucket)
    params: dict[str, Any] = {
        "starts": [s.start for s in spans], "stops": stops,
        "primaries": [s.primary for s in spans], "candidates": [s.candidate for s in spans],
        "percents": [s.percent for s in spans], "baseline": baseline, "candidate": candidate,
        "since": since}
    with conn.transaction():
        _read_only(conn, timeout_ms)
        rows = conn.execute(query, params).fetchall()
    found: list[list[ArmSummary]] = [[NOTHING, NOTHING] for _ in spans]
    for n, arm, count, total, squares in rows:
        found[n - 1][0 if arm == baseline else 1] = ArmSummary(int(count), float(total),
                                                                max(0.0, float(squares)))
    return [(a, b) for a, b in found]


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# Routing history and looks --------------------------------------------------------------------
def routing_spans(conn: psycopg.Connection, schema: str, alias: str) -> list[RoutingSpan]:
    rows = conn.execute(sql.SQL(
        "SELECT at, action, from_version, to_version, percent FROM {} WHERE alias = %s "
        "ORDER BY id").format(qualified(schema, "alias_history")), (alias,)).fetchall()
    return [span_after(*row) for row in rows]


def record_look(conn: psycopg.Connection, schema: str, plan_id: int, look: int, at: datetime,
                percent: int, next_percent: int, verdict: str, reason: str,
                evidence: dict[str, Any]) -> None:
    conn.execute(sql.SQL(
        "INSERT INTO {} (plan_id, look, at, percent, next_percent, verdict, reason, evidence) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (plan_id, look) DO NOTHING").format(
        qualified(schema, "experiment_looks")),
        (plan_id, look, at, percent, next_percent, verdict, reason, Jsonb(evidence)))


def looks(conn: psycopg.Connection, schema: str, plan_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(sql.SQL(
        "SELECT look, at, percent, next_percent, verdict, reason, evidence FROM {} "
        "WHERE plan_id = %s ORDER BY look").format(qualified(schema, "experiment_looks")),
        (plan_id,)).fetchall()
    keys = ("look", "at", "percent", "next_percent", "verdict", "reason", "evidence")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def now(conn: psycopg.Connection) -> datetime:
    """The database's clock: the routing history's instants come from it too."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    if row is None:
        raise KappaError("PostgreSQL did not tell the time: run the command again")
    value: datetime = row[0]
    return value
