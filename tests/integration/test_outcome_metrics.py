"""Outcome metrics against a real PostgreSQL: their checks, and attribution in SQL against the
pure attribution it must equal."""

from __future__ import annotations

import json
import random
import uuid
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
                             "spent numeric, observed_at timestamptz, note text)").format(
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
                    "observed_at"),
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
    from orchestrator.catalog import outcomes
    from orchestrator.experiment.attribution import (
        Observation,
        RoutingSpan,
        attribute,
        key_bucket,
        spans_since,
    )
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.experiment.sequential import summarize
    from orchestrator.service import Orchestrator

    Orchestrator(settings).status()  # the catalog, migrated: its key_bucket()
    rng = random.Random(23)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    keys = [f"/page/{i}?q={rng.random():.6f}" for i in range(300)] + ["", "ünïcode", "a'b"]
    spans = [RoutingSpan(t0, "v1", None, 0), RoutingSpan(t0 + timedelta(minutes=5), "v1", "v2", 10),
             RoutingSpan(t0 + timedelta(minutes=9), "v1", "v2", 60),
             RoutingSpan(t0 + timedelta(minutes=12), "v1", "v3", 30),  # a third version
             RoutingSpan(t0 + timedelta(minutes=14), "v2", None, 0)]
    observations = [Observation(rng.choice(keys), float(rng.random() < 0.3 + 0.01 * (i % 7)),
                                t0 + timedelta(seconds=rng.uniform(-60, 1000)))
                    for i in range(5000)]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with conn.cursor().copy(sql.SQL("COPY {} (key, converted, observed_at) FROM STDIN")
                                .format(sql.SQL(app_table))) as copy:
            for o in observations:
                copy.write_row((o.key, bool(o.value), o.observed_at))
        buckets = dict(conn.execute(sql.SQL("SELECT k, {}.key_bucket(k) FROM unnest(%s::text[]) k")
                                    .format(sql.Identifier(settings.catalog_schema)),
                                    (keys,)).fetchall())
        assert buckets == {k: key_bucket(k) for k in keys}
        metric = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, sql=(
            f"SELECT key, converted::int AS value, observed_at FROM {app_table} "
            "WHERE observed_at >= {since}"))
        since, until = t0 + timedelta(minutes=3), t0 + timedelta(minutes=16)
        kept = spans_since(spans, since)
        found = outcomes.strata(conn, metric, kept, baseline="v1", candidate="v2",
                                since=since, until=until, timeout_ms=10_000)
    assert len(found) == len(kept) == 5
    for index, (span, (baseline, candidate)) in enumerate(zip(kept, found, strict=True)):
        stop = kept[index + 1].start if index + 1 < len(kept) else until
        inside = [o for o in observations if span.start <= o.observed_at < stop]
        expected = attribute(inside, [span], ("v1", "v2"))
        for got, want in ((baseline, summarize(expected["v1"])),
                          (candidate, summarize(expected["v2"]))):
            assert got.count == want.count
            assert got.total == pytest.approx(want.total)
            assert got.squares == pytest.approx(want.squares, abs=1e-6)
    assert found[3][1].count == 0  # v3 served the candidate's share: none of it counts for v2
    assert found[4][0].count == 0 and found[4][1].count > 0  # v2 promoted
