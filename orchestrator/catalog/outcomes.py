"""Outcome metrics in the catalog, their observations read from the application's tables, and
the looks of outcome cutovers.

A metric's SQL is the operator's text: it runs only inside a READ ONLY transaction with a
statement timeout, wrapped so that exactly the columns ``key``, ``value``, ``observed_at`` (and
``served_at`` where it gives it) are read, and its ``{since}`` placeholder becomes a bound
parameter. Observations are credited to the arm that served their key when it was served, or
else when they were observed, in SQL: the routing spans arrive as arrays, and a key's bucket is
computed as the catalog's ``key_bucket()`` computes it, so the query needs nothing of the
catalog in the application's database. They are grouped by key, the unit the alias splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from orchestrator.catalog.db import qualified
from orchestrator.errors import KappaError, NotFoundError, StateError
from orchestrator.experiment.attribution import RoutingSpan, span_after
from orchestrator.experiment.by_key import (
    NO_EVIDENCE,
    NO_KEYS,
    Coefficient,
    KeyedArm,
    KeyedStrata,
    KeySums,
    Weighing,
    weigh,
)
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role

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
def _metric_text(metric: OutcomeMetric) -> str:
    assert metric.sql is not None
    return metric.sql.strip().rstrip(";").replace("%", "%%").replace("{since}", "%(since)s")


def _observations(metric: OutcomeMetric, served_at: bool) -> sql.Composable:
    """The metric's query as a subquery of exactly (key text, value float8, observed_at,
    served_at), served_at null where the metric does not give it."""
    return sql.Composed([
        sql.SQL("SELECT m.key::text AS key, m.value::float8 AS value, "
                "m.observed_at::timestamptz AS observed_at, "
                + ("m.served_at::timestamptz" if served_at else "NULL::timestamptz")
                + " AS served_at FROM ("),
        sql.SQL(_metric_text(metric)),  # type: ignore[arg-type]  # the operator's own query
        sql.SQL(") AS m"),
    ])


def _read_only(conn: psycopg.Connection, timeout_ms: int) -> None:
    conn.execute("SET TRANSACTION READ ONLY")
    conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(
        sql.Literal(f"{int(timeout_ms)}ms")))


def probe(conn: psycopg.Connection, metric: OutcomeMetric, *, since: datetime,
          timeout_ms: int) -> bool:
    """Run the metric's query once, reading no row, to refuse before anything is switched a
    query with a syntax error, other columns, or one that writes. True when it gives
    ``served_at``, the instant its key was served."""
    where = f"metric {metric.name}"
    try:
        with conn.transaction():
            _read_only(conn, timeout_ms)
            cur = conn.execute(sql.Composed([sql.SQL("SELECT * FROM ("),
                                             sql.SQL(_metric_text(metric)),  # type: ignore
                                             sql.SQL(") AS m LIMIT 0")]), {"since": since})
            found = [(c.name, c.type_code) for c in cur.description or []]
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise StateError(f"{where}: its SQL writes ({first_line(exc)}); it must be one SELECT "
                         "that changes nothing") from exc
    except psycopg.Error as exc:
        raise StateError(f"{where}: its SQL fails: {first_line(exc)}; fix it and run "
                         "`kappa metric define` again") from exc
    names = [name for name, _ in found]
    if sorted(names) not in (sorted(COLUMNS), sorted((*COLUMNS, "served_at"))):
        raise StateError(f"{where}: its SQL must return exactly the columns key, value and "
                         "observed_at, and served_at if it knows it (alias them with AS), not "
                         f"{', '.join(names) or 'none'}")
    types = dict(found)
    if types["value"] not in _NUMERIC_OIDS:
        raise StateError(f"{where}: its value column must be a number (0/1 for a "
                         "proportion): cast it, e.g. converted::int AS value")
    for column in ("observed_at", "served_at"):
        if column in types and types[column] not in _TIME_OIDS:
            raise StateError(f"{where}: its {column} column must be a timestamp, cast it "
                             "with ::timestamptz")
    return "served_at" in types


@dataclass(frozen=True)
class Attribution:
    """How a look credits a metric's observations: the test's spans (its strata, from its
    start); with ``delay_s`` or ``pre_period_s`` the alias's routing since that much before
    the start, to look back on (the attribution window, and the keys' history: what they did
    while the baseline served them)."""
    spans: Sequence[RoutingSpan]
    started: datetime
    until: datetime
    served_at: bool = False
    delay_s: float = 0.0
    routing: Sequence[RoutingSpan] = ()
    pre_period_s: float = 0.0

    @property
    def history_since(self) -> datetime:
        return self.started - timedelta(seconds=self.pre_period_s)


def _spans_array(prefix: str, spans: Sequence[RoutingSpan]) -> dict[str, Any]:
    """The spans as the arrays the SQL reads (each ends where the next starts, the last at the
    look's instant)."""
    return {f"{prefix}starts": [s.start for s in spans],
            f"{prefix}primaries": [s.primary for s in spans],
            f"{prefix}candidates": [s.candidate for s in spans],
            f"{prefix}percents": [s.percent for s in spans]}


def _serving(prefix: str, span: str, key: str) -> sql.Composable:
    """The version that span number ``span`` (1-based) of the arrays ``prefix`` served ``key``
    with: key_bucket() computed as the catalog computes it, so the query needs nothing of the
    catalog in the application's database."""
    return sql.SQL(
        "CASE WHEN (%({p}candidates)s::text[])[{n}] IS NOT NULL AND (('x' || substr(md5({k}), 1, "
        "8))::bit(32)::bigint %% 100) < (%({p}percents)s::int[])[{n}] THEN "
        "(%({p}candidates)s::text[])[{n}] ELSE (%({p}primaries)s::text[])[{n}] END").format(
        p=sql.SQL(prefix), n=sql.SQL(span), k=sql.SQL(key))


def _span(prefix: str, instant: str) -> str:
    """The 1-based number of the span of the arrays ``prefix`` that holds ``instant`` (0:
    before the first): width_bucket() over the starts, a binary search."""
    return f"width_bucket({instant}, %({prefix}starts)s::timestamptz[])"


def _exact_sum(expression: str, where: str | None = None) -> str:
    """sum() of float8 values, exact and rounded once (as math.fsum): the same rows give the
    same bits in whatever order a plan reads them. Each value goes through its shortest exact
    text (extra_float_digits > 0, set for the look) into numeric, whose additions are exact."""
    also = f" FILTER (WHERE {where})" if where else ""
    return f"(sum(({expression})::text::numeric){also})::float8"


# by_key.key_history in SQL: each key's mean before the test less the mean of all, shrunk by
# the share of its spread that is the key's own (between / (between + within / m)), and what
# that leaves unknown (1 less that share). Materialized: read once, not once per observation.
_HISTORY = sql.SQL(
    f"pooled AS (SELECT {_exact_sum('x')} / sum(m) AS mean, sum(m) AS n, sum(m * m) AS nn, "
    f"count(*) AS keys, {_exact_sum('xx - x * x / m')} AS within_squares, "
    f"{_exact_sum('x * x / m')} AS key_squares FROM before), "
    "spread AS (SELECT mean, CASE WHEN n > keys THEN greatest(within_squares / (n - keys), 0) "
    "ELSE 0 END AS within, n, nn, keys, key_squares FROM pooled), "
    "components AS (SELECT mean, within, CASE WHEN n - nn / n > 0 THEN greatest((key_squares "
    "- n * mean * mean - within * (keys - 1)) / (n - nn / n), 0) ELSE 0 END AS between "
    "FROM spread), "
    "known AS (SELECT key, x / m - mean AS deviation, CASE WHEN m * between + within > 0 THEN "
    "m * between / (m * between + within) ELSE 0 END AS share FROM before, components), "
    "history AS MATERIALIZED (SELECT key, share * deviation AS h, 1 - share AS u FROM known)")


def _cells(metric: OutcomeMetric, how: Attribution) -> sql.Composable:
    """WITH ... cells: per stratum, arm and key, the observations kept, their sum and sum of
    squares, and those left out because the key moved within the delay. The spans arrive as
    arrays; an instant's span is a binary search in their starts, its routing read by
    subscript."""
    at = "o.served_at" if how.served_at else "o.observed_at"
    moved: sql.Composable = sql.SQL("false")
    if how.delay_s > 0 and not how.served_at:
        moved = sql.SQL(
            "EXISTS (SELECT 1 FROM generate_series(greatest({first}, 1), {last}) AS w(n) "
            "WHERE {then} IS DISTINCT FROM o.arm)").format(
            first=sql.SQL(_span("w_", "o.observed_at - %(delay)s * interval '1 second'")),
            last=sql.SQL(_span("w_", "o.observed_at")), then=_serving("w_", "w.n", "o.key"))
    return sql.SQL(
        "WITH observed AS ({observations}), "
        f"before AS MATERIALIZED (SELECT o.key, count(*) AS m, {_exact_sum('o.value')} AS x, "
        f"{_exact_sum('o.value * o.value')} AS xx "
        "FROM (SELECT *, {window_span} AS w FROM observed o "
        "WHERE {at} >= %(history_since)s AND {at} < %(started)s AND observed_at < %(until)s "
        "AND key IS NOT NULL AND value IS NOT NULL) o "
        "WHERE o.w > 0 AND {baseline} = %(baseline)s GROUP BY o.key), "
        "{history}, "
        "o AS (SELECT o.*, {arm} AS arm FROM (SELECT *, {test_span} AS n FROM observed o WHERE "
        "key IS NOT NULL AND value IS NOT NULL AND observed_at < %(until)s AND {at} >= "
        "%(started)s AND {at} < %(until)s) o WHERE o.n > 0), "
        "credited AS (SELECT o.n, o.arm, o.key, o.value, {moved} AS moved, "
        "coalesce(history.h, 0) AS h, coalesce(history.u, 1) AS u FROM o LEFT JOIN history "
        "ON history.key = o.key WHERE o.arm IN (%(baseline)s, %(candidate)s)), "
        "cells AS (SELECT n, arm, key, count(*) FILTER (WHERE NOT moved) AS c, "
        f"coalesce({_exact_sum('value', 'NOT moved')}, 0) AS y, "
        f"coalesce({_exact_sum('value * value', 'NOT moved')}, 0) AS q, "
        "count(*) FILTER (WHERE moved) AS moved, max(h) AS h, max(u) AS u FROM credited "
        "GROUP BY n, arm, key) ").format(
        observations=_observations(metric, how.served_at), at=sql.SQL(at),
        window_span=sql.SQL(_span("w_", at.replace("o.", ""))),
        baseline=_serving("w_", "o.w", "o.key"), history=_HISTORY,
        test_span=sql.SQL(_span("", at.replace("o.", ""))), arm=_serving("", "o.n", "o.key"),
        moved=moved)


def strata(conn: psycopg.Connection, metric: OutcomeMetric, how: Attribution, *,
           baseline: str, candidate: str, since: datetime, timeout_ms: int
           ) -> tuple[KeyedStrata, int]:
    """Per span of the test's routing (spans that serve neither arm count for none), each
    arm's observations before ``how.until`` grouped by key, each credited to the arm that
    served its key (:mod:`orchestrator.experiment.attribution` is the model of this SQL); and
    how many were left out because their key moved within the attribution delay. Both passes
    of :mod:`orchestrator.experiment.by_key` read one snapshot."""
    if not how.spans:
        return NO_EVIDENCE, 0
    params: dict[str, Any] = {
        **_spans_array("", how.spans), **_spans_array("w_", how.routing),
        "baseline": baseline, "candidate": candidate, "since": since, "until": how.until,
        "started": how.started, "delay": how.delay_s, "history_since": how.history_since}
    cells = _cells(metric, how)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        _read_only(conn, timeout_ms)
        conn.execute("SET LOCAL extra_float_digits = 1")  # _exact_sum's exact text
        rows = conn.execute(cells + sql.SQL(
            f"SELECT n, arm, sum(c), {_exact_sum('y')}, {_exact_sum('q')}, "
            "count(*) FILTER (WHERE c > 0), sum(c * c), "
            f"coalesce({_exact_sum('y * y / c', 'c > 0')}, 0), {_exact_sum('c * h')}, "
            f"{_exact_sum('c * h * h')}, {_exact_sum('y * h')}, {_exact_sum('c * u')}, "
            f"{_exact_sum('c * c * u')}, sum(moved) FROM cells GROUP BY n, arm"),
            params).fetchall()
        found: list[list[KeyedArm]] = [[NO_KEYS, NO_KEYS] for _ in how.spans]
        left_out = 0
        for row in rows:
            n, arm, count, total, squares, keys, count_squares, key_squares = row[:8]
            by_history, by_history_squares, total_history, by_unknown, squares_unknown, moved = \
                row[8:]
            found[n - 1][0 if arm == baseline else 1] = KeyedArm(
                int(count), float(total), float(squares), int(keys), float(count_squares),
                float(key_squares), float(by_history), float(by_history_squares),
                float(total_history), float(by_unknown), float(squares_unknown))
            left_out += int(moved)
        keyed = tuple((a, b) for a, b in found)
        weighing = weigh(keyed)
        if weighing is None:
            return KeyedStrata(keyed, None), left_out
        return KeyedStrata(keyed, _key_sums(conn, cells, params, weighing)), left_out


# A key's terms in one stratum and arm: its weight times its observations, and times its
# residuals (its values less theta times its history, less the arm's mean).
_LOADING = "CASE WHEN arm = %(candidate)s THEN cand_weight ELSE base_weight END * c"
_RESIDUAL = ("CASE WHEN arm = %(candidate)s THEN cand_weight * (y - %(theta)s * c * h - "
             "cand_mean * c) ELSE base_weight * (y - %(theta)s * c * h - base_mean * c) END")


def _key_sums(conn: psycopg.Connection, cells: sql.Composable, params: dict[str, Any],
              weighing: Weighing) -> KeySums:
    """by_key's second pass: each key's sums against the first pass's coefficients."""
    none = Coefficient(0.0, 0.0)
    pairs = [pair or (none, none) for pair in weighing.coefficients]
    row = conn.execute(cells + sql.SQL(
        ", coefficients AS (SELECT * FROM unnest(%(base_weight)s::float8[], "
        "%(base_mean)s::float8[], %(cand_weight)s::float8[], %(cand_mean)s::float8[]) WITH "
        "ORDINALITY AS x(base_weight, base_mean, cand_weight, cand_mean, n)), "
        f"per_key AS (SELECT key, {_exact_sum(_LOADING)} AS loading, "
        f"{_exact_sum(_RESIDUAL)} AS residual, "
        "bool_or(base_weight <> 0) AS used, sum(c) FILTER (WHERE arm = %(baseline)s) AS "
        "base_n, sum(c) FILTER (WHERE arm = %(candidate)s) AS cand_n, max(u) AS u FROM cells "
        "JOIN coefficients USING (n) WHERE c > 0 GROUP BY key) "
        f"SELECT coalesce({_exact_sum('loading * loading * u')}, 0), "
        f"coalesce({_exact_sum('residual * residual')}, 0), "
        "count(*) FILTER (WHERE used), count(base_n), count(cand_n), "
        f"coalesce({_exact_sum('base_n * base_n * u')}, 0), "
        f"coalesce({_exact_sum('cand_n * cand_n * u')}, 0) "
        "FROM per_key"),
        {**params, "base_weight": [a.weight for a, _ in pairs],
         "base_mean": [a.mean for a, _ in pairs], "cand_weight": [b.weight for _, b in pairs],
         "cand_mean": [b.mean for _, b in pairs], "theta": weighing.history_slope}).fetchone()
    assert row is not None
    loadings, residuals, keys, base_keys, cand_keys, base_squares, cand_squares = row
    return KeySums(float(loadings), float(residuals), int(keys), int(base_keys), int(cand_keys),
                   float(base_squares), float(cand_squares))


def clock_skew(catalog: psycopg.Connection, outcomes_db: psycopg.Connection) -> float:
    """How far the outcome database's clock is ahead of the catalog's, in seconds: its
    instant against the middle of two catalog instants read around it (observed_at comes from
    one clock, the routing history's instants from the other)."""
    before = now(catalog)
    theirs = now(outcomes_db)
    after = now(catalog)
    return (theirs - (before + (after - before) / 2)).total_seconds()


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
