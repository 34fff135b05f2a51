"""What a reader pays for the alias: a statement through `serving.<job>` against the same
statement on the table of the version that serves it.

    .venv/bin/python bench/alias_cost.py [--records 300000] [--users 150000] [--runs 15] [--json]

Sets up its own embedded stack (or uses KAPPA_PG_DSN / KAPPA_KAFKA_BOOTSTRAP), produces a
changelog of user profiles, deploys user_profiles v1 and a copy of it under another VERSION (the
same code, so both tables hold the same rows), and lets both catch up. Then, with the alias in
each routing state:
- "0 %": v1 serves every key, after an A/B of the copy was rolled back (the copy stays in the
  view);
- "10 %": an A/B that sends the keys of buckets 0..9 to the copy;
- "100 %": the copy promoted, serving every key (v1 stays in the view);
it times three statements, each the median of RUNS runs on one connection, through the alias
and on the primary's table: a point lookup by key, a top-10 and a full-scan aggregate. Prints
the ratios (1.0: the alias costs nothing). `bench/switch.py --reader-cost` runs it too. It
asserts nothing about speed; it checks that the alias and the table return the same rows where
one version serves every key.
"""

from __future__ import annotations

import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

JOB = "user_profiles"
WARM_RUNS = 12
COPY = "v1copy"
STATEMENTS = {
    "point_lookup": "SELECT user_id, plan, country, city, tags, updated_at FROM {} "
                    "WHERE user_id = %(key)s",
    "top_10": "SELECT user_id, plan, updated_at FROM {} ORDER BY updated_at DESC, user_id "
              "LIMIT 10",
    "full_scan_aggregate": "SELECT country, count(*), max(updated_at) FROM {} GROUP BY country",
}


def _median_s(conn: psycopg.Connection, text: sql.Composable, keys: list[int], runs: int
              ) -> tuple[float, list[Any]]:
    times, rows = [], []
    for run in range(runs):
        began = time.perf_counter()
        rows = conn.execute(text, {"key": keys[run % len(keys)]}).fetchall()
        times.append(time.perf_counter() - began)
    return statistics.median(times), rows


def measure(conn: psycopg.Connection, settings: Any, primary: str, runs: int,
            keys: list[int], *, exact: bool) -> dict[str, Any]:
    """Each statement through the alias over the same on ``primary``'s table."""
    alias = sql.Identifier(settings.serving_schema, JOB)
    table = sql.Identifier(settings.data_schema, f"{JOB}__{primary}")
    out: dict[str, Any] = {}
    for name, text in STATEMENTS.items():
        # Warm both to their steady state: pages in the cache, and past psycopg's prepare
        # threshold and PostgreSQL's five custom plans, after which a prepared statement may
        # run a generic plan. Otherwise the first state measured pays planning that later
        # states, running the same statement text, no longer pay.
        for target in (alias, table):
            for run in range(WARM_RUNS):
                conn.execute(sql.SQL(text).format(target), {"key": keys[run % len(keys)]})
        through, served = _median_s(conn, sql.SQL(text).format(alias), keys, runs)
        direct, own = _median_s(conn, sql.SQL(text).format(table), keys, runs)
        if exact and sorted(map(repr, served)) != sorted(map(repr, own)):
            raise RuntimeError(f"{name}: the alias returned other rows than {primary}'s table")
        out[name] = {"alias_ms": round(1000 * through, 3), "table_ms": round(1000 * direct, 3),
                     "alias_over_table": round(through / direct, 3)}
    return out


def reader_cost(service: Any, settings: Any, workdir: Path, tag: str, *, records: int,
                users: int, runs: int) -> dict[str, Any]:
    """Deploy v1 and its copy on a new profiles topic and measure the alias in each state."""
    root = Path(__file__).resolve().parents[1]
    topic = f"profiles_bench_{tag}"
    service.produce_sample(topic, records, seed=5, kind="profiles", users=users)
    source = re.sub(r"^TOPICS = .*$", f'TOPICS = ["{topic}"]',
                    (root / "jobs" / JOB / "v1.py").read_text(), flags=re.M)
    (workdir / "v1.py").write_text(source)
    # The copy declares a guardrail, so that its validation checks something and an A/B may
    # start.
    (workdir / "copy.py").write_text(
        re.sub(r'^VERSION = .*$', f'VERSION = "{COPY}"', source, flags=re.M)
        + '\nGUARDRAILS = {"same rows": "SELECT (SELECT count(*) FROM {this}) = '
          '(SELECT count(*) FROM {other})"}\n')
    service.deploy(workdir / "v1.py")
    service.deploy(workdir / "copy.py")
    for version in ("v1", COPY):
        service.wait(JOB, version, timeout_s=900)
    service.diff(JOB, COPY, "v1")
    service.diff(JOB, "v1", COPY)
    service.promote(JOB, "v1", force=True, reason="alias cost: v1 first (no guardrails)")
    results: dict[str, Any] = {}
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        (rows,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(settings.data_schema, f"{JOB}__v1"))).fetchone() or (0,)
        keys = [k for (k,) in conn.execute(sql.SQL("SELECT user_id FROM {}").format(
            sql.Identifier(settings.data_schema, f"{JOB}__v1")))]
        keys = random.Random(1).sample(keys, min(len(keys), runs))
        service.ab(JOB, COPY, 10, reason="alias cost")
        service.rollback(JOB, reason="alias cost")
        results["0 %"] = measure(conn, settings, "v1", runs, keys, exact=True)
        service.ab(JOB, COPY, 10, reason="alias cost")
        results["10 %"] = measure(conn, settings, "v1", runs, keys, exact=False)
        service.promote(JOB, COPY, reason="alias cost")
        results["100 %"] = measure(conn, settings, COPY, runs, keys, exact=True)
    return {"rows_per_table": rows, "runs": runs, "states": results}


def show(result: dict[str, Any]) -> None:
    print(f"alias cost, {result['rows_per_table']:,} rows per table, medians of "
          f"{result['runs']} runs (alias over table):")
    for state, statements in result["states"].items():
        print(f"  {state:>6}: " + ", ".join(
            f"{name} {m['alias_over_table']}x ({m['alias_ms']} / {m['table_ms']} ms)"
            for name, m in statements.items()))


def main() -> int:
    import argparse
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.stack import bench_stack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=150_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with bench_stack("alias_cost", serving=True) as (settings, service, workdir, tag):
        result = reader_cost(service, settings, workdir, tag, records=args.records,
                             users=args.users, runs=args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
