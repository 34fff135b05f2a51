"""Outcome metrics against a real PostgreSQL: their checks, and attribution in SQL against the
pure attribution it must equal."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import astuple
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from conftest import kappa_cli

pytestmark = [pytest.mark.integration]


@pytest.fixture
def app_table(settings) -> str:
    """An application's table of outcomes, in a schema of its own."""
    schema = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE TABLE {}.outcomes (key text, converted boolean, "
                             "spent numeric, observed_at timestamptz, note text, "
                             "served_at timestamptz)").format(
            sql.Identifier(schema)))
    return f"{schema}.outcomes"


def test_a_metric_is_checked_against_its_database_and_refused_in_one_line(settings, app_table
                                                                          ) -> None:
    good = f"SELECT key, converted::int AS value, observed_at FROM {app_table} " \
           "WHERE observed_at >= {since} AND note NOT LIKE '%test%'"
    cases = {
        "syntax": (f"SELEC key FROM {app_table} WHERE observed_at >= {{since}}",
                   "its SQL fails: syntax error"),
        "columns": (f"SELECT key, converted AS conv, observed_at FROM {app_table} "
                    "WHERE observed_at >= {since}", "exactly the columns key, value and "
                    "observed_at, and served_at if it knows it"),
        "served": (f"SELECT key, spent AS value, observed_at, note AS served_at FROM "
                   f"{app_table} WHERE observed_at >= {{since}}",
                   "its served_at column must be a timestamp"),
        "boolean": (f"SELECT key, converted AS value, observed_at FROM {app_table} "
                    "WHERE observed_at >= {since}", "value column must be a number"),
        # No statement word the check knows, but it locks rows: READ ONLY refuses it.
        "writes": (f"SELECT key, spent AS value, observed_at FROM {app_table} "
                   "WHERE observed_at >= {since} FOR SHARE", "its SQL writes"),
        "statement": (f"DELETE FROM {app_table} WHERE observed_at >= {{since}}",
                      "one SELECT that changes nothing"),
        "since": (f"SELECT key, spent AS value, observed_at FROM {app_table}",
                  "{since} placeholder"),
    }
    for name, (text, says) in cases.items():
        refused = kappa_cli(settings, "metric", "define", "pageview_counts", name, "--sql", text,
                            "--kind", "mean", "--better", "higher")
        assert refused.returncode == 1, (name, refused.stdout)
        assert says in refused.stderr and refused.stderr.count("\n") == 1, (name, refused.stderr)
    promql = kappa_cli(settings, "metric", "define", "pageview_counts", "clicks", "--promql",
                       "sum(rate(clicks_total[5m]))", "--kind", "mean", "--better", "higher")
    assert promql.returncode == 1 and "{version} placeholder" in promql.stderr
    assert json.loads(kappa_cli(settings, "metric", "list", "--json").stdout) == []

    defined = kappa_cli(settings, "metric", "define", "pageview_counts", "converts", "--sql",
                        good, "--kind", "proportion", "--better", "higher", "--json")
    assert defined.returncode == 0, defined.stderr
    (listed,) = json.loads(kappa_cli(settings, "metric", "list", "pageview_counts",
                                     "--json").stdout)
    assert (listed["metric"], listed["kind"], listed["role"], listed["sql"]) == (
        "converts", "proportion", "decision", good)
    assert kappa_cli(settings, "metric", "drop", "pageview_counts", "converts").returncode == 0
    gone = kappa_cli(settings, "metric", "drop", "pageview_counts", "converts")
    assert gone.returncode == 1 and "has no outcome metric converts" in gone.stderr


def test_attribution_in_sql_equals_the_pure_attribution(settings, app_table) -> None:
    """The SQL that a look runs against attribution.credit and by_key (the model that the
    simulations use), by observed_at, by served_at and with an attribution delay: the same
    cells by stratum, arm and key, the same left out, the same second pass."""
    from orchestrator.catalog import outcomes
    from orchestrator.experiment.attribution import (
        Observation,
        RoutingSpan,
        credit,
        key_bucket,
        spans_since,
    )
    from orchestrator.experiment.by_key import key_history, key_sums, keyed_arm, weigh
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.service import Orchestrator

    Orchestrator(settings).status()  # the catalog, migrated: its key_bucket()
    rng = random.Random(23)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    keys = [f"/page/{i}?q={rng.random():.6f}" for i in range(300)] + ["", "ünïcode", "a'b"]
    history = [RoutingSpan(t0, "v1", None, 0),
               RoutingSpan(t0 + timedelta(minutes=5), "v1", "v2", 10),
               RoutingSpan(t0 + timedelta(minutes=9), "v1", "v2", 60),
               RoutingSpan(t0 + timedelta(minutes=12), "v1", "v3", 30),  # a third version
               RoutingSpan(t0 + timedelta(minutes=14), "v2", None, 0)]
    observations = []
    for i in range(5000):
        served = t0 + timedelta(seconds=rng.uniform(-60, 1000))
        observations.append(Observation(rng.choice(keys[:40] if i % 3 else keys),
                                        float(rng.random() < 0.3 + 0.01 * (i % 7)),
                                        served + timedelta(seconds=rng.uniform(0, 90)), served))
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with conn.cursor().copy(sql.SQL("COPY {} (key, converted, observed_at, served_at) FROM "
                                        "STDIN").format(sql.SQL(app_table))) as copy:
            for o in observations:
                copy.write_row((o.key, bool(o.value), o.observed_at, o.served_at))
        buckets = dict(conn.execute(sql.SQL("SELECT k, {}.key_bucket(k) FROM unnest(%s::text[]) k")
                                    .format(sql.Identifier(settings.catalog_schema)),
                                    (keys,)).fetchall())
        assert buckets == {k: key_bucket(k) for k in keys}
        plain, served_at = (OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, sql=(
            f"SELECT key, converted::int AS value, observed_at{extra} FROM {app_table} "
            "WHERE observed_at >= {since}")) for extra in ("", ", served_at"))
        assert outcomes.probe(conn, plain, since=t0, timeout_ms=10_000) is False
        assert outcomes.probe(conn, served_at, since=t0, timeout_ms=10_000) is True
        started, until = t0 + timedelta(minutes=3), t0 + timedelta(minutes=16)
        spans = spans_since(history, started)
        for metric, by_served_at, delay, pre in ((plain, False, 0.0, 0.0),
                                                 (served_at, True, 0.0, 0.0),
                                                 (plain, False, 45.0, 0.0),
                                                 (served_at, True, 0.0, 600.0),
                                                 (plain, False, 45.0, 600.0)):
            back = started - timedelta(seconds=max(delay, pre))
            routing = spans_since(history, back) if back < started else []
            how = outcomes.Attribution(spans, started, until, by_served_at, delay, routing, pre)
            found, left_out = outcomes.strata(conn, metric, how, baseline="v1", candidate="v2",
                                              since=back, timeout_ms=10_000)
            model = credit(observations, spans, ("v1", "v2"), started=started, until=until,
                           routing=routing, delay_s=delay, by_served_at=by_served_at,
                           history_since=how.history_since if pre else None)
            case = (by_served_at, delay, pre)
            assert left_out == model.left_out, case
            assert (left_out > 0) == (delay > 0), case
            keys_history = key_history(model.before)
            assert bool(keys_history) == (pre > 0), case
            expected = tuple((keyed_arm(a.values(), [keys_history.get(k, (0.0, 1.0)) for k in a]),
                              keyed_arm(b.values(), [keys_history.get(k, (0.0, 1.0)) for k in b]))
                             for a, b in model.cells)
            assert len(found.strata) == len(expected) == 5
            for got_pair, want_pair in zip(found.strata, expected, strict=True):
                for got, want in zip(got_pair, want_pair, strict=True):
                    assert (got.count, got.keys) == (want.count, want.keys), case
                    for field in ("total", "squares", "count_squares", "key_squares",
                                  "count_history", "history_squares", "total_history",
                                  "unknown_count", "unknown_count_squares"):
                        assert getattr(got, field) == pytest.approx(getattr(want, field)), case
            weighing = weigh(expected)
            assert weighing is not None and found.sums is not None
            assert (weighing.history_slope != 0) == (pre > 0), case
            reference = key_sums(weighing, {
                arm: [{k: (n, y) for k, (n, y, _) in cells[side].items()}
                      for cells in model.cells]
                for side, arm in enumerate(("baseline", "candidate"))}, keys_history)
            assert astuple(found.sums) == pytest.approx(astuple(reference)), case
            assert found.strata[3][1].count == 0  # v3 served the candidate's share
            assert found.strata[4][0].count == 0 and found.strata[4][1].count > 0  # promoted


def test_the_same_observations_in_any_order_give_the_same_bits(settings) -> None:
    """A look's evidence is a sum of many floating-point values; summed in the order the rows
    happen to come, the same observations gave a different last bit after a table was rewritten
    or a plan changed (a killed cutover's last look against its resumed run's first, in CI:
    0.029690562642588608 against 0.02969056264258861). Sums are exact, so the order of the rows
    cannot show in the result."""
    from orchestrator.catalog import outcomes
    from orchestrator.experiment.attribution import RoutingSpan, spans_since
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.service import Orchestrator

    Orchestrator(settings).status()  # the catalog, migrated: its key_bucket()
    rng = random.Random(59)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    keys = [f"/page/{i}" for i in range(60)]
    history = [RoutingSpan(t0, "v1", None, 0),
               RoutingSpan(t0 + timedelta(minutes=5), "v1", "v2", 30),
               RoutingSpan(t0 + timedelta(minutes=9), "v1", "v2", 60)]
    # Keys whose levels differ (so that their histories count), over many magnitudes (so that
    # a sum depends on the order it is taken in).
    level = {key: 10.0 ** (i % 7 - 3) for i, key in enumerate(keys)}
    rows = []
    for _ in range(6000):
        key = rng.choice(keys)
        rows.append((key, level[key] * rng.lognormvariate(0, 0.5),
                     t0 + timedelta(seconds=rng.uniform(0, 780))))
    schema = f"app_{uuid.uuid4().hex[:8]}"
    found = []
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for table, order in (("ordered", rows), ("shuffled", rng.sample(rows, len(rows))),
                             ("sorted", sorted(rows, key=lambda r: -r[1]))):
            name = sql.Identifier(schema, table)
            conn.execute(sql.SQL("CREATE TABLE {} (key text, spent float8, observed_at "
                                 "timestamptz)").format(name))
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(name)) as copy:
                for row in order:
                    copy.write_row(row)
            metric = OutcomeMetric("spent", Kind.MEAN, True, Role.DECISION, sql=(
                f"SELECT key, spent AS value, observed_at FROM {schema}.{table} "
                "WHERE observed_at >= {since}"))
            started, until = t0 + timedelta(minutes=3), t0 + timedelta(minutes=13)
            back = t0
            how = outcomes.Attribution(spans_since(history, started), started, until, False,
                                       0.0, spans_since(history, back), 180.0)
            keyed, _ = outcomes.strata(conn, metric, how, baseline="v1", candidate="v2",
                                       since=back, timeout_ms=10_000)
            assert keyed.sums is not None and keyed.strata[0][0].count_history != 0
            found.append(keyed)
    ordered, shuffled, by_size = found
    assert shuffled == ordered and by_size == ordered
