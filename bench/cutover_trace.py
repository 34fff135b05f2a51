"""One outcome cutover, run for real, look by look: the trace behind the performance page's
cutover figure (bench/plots.py).

    .venv/bin/python bench/cutover_trace.py [--strategy bandit] [--rates 0.30 0.345]
                                            [--readers-per-s 400] [--seed 5] [--json]

Sets up its own embedded stack (bench/stack.py), deploys pageview_counts v1 and v2 on a small
topic, serves v1 through the alias (with a served_by column) and defines the decision metric
``converts`` over an application table. An application then reads the alias by key, a fixed
number of readers a second, and writes whether each reader converted, at a true rate that depends
on the version that served the key (--rates: v1's, v2's). Meanwhile the real
``kappa cutover pageview_counts v2 --strategy bandit --metric converts`` runs to its decision.
Prints the plan's looks as ``kappa experiment --json`` gives them (each look's share, verdict
and the always-valid interval of the difference), with the true rates and the command.
It asserts nothing: a run decides what it decides.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench/ is not a package on the path
    sys.path.insert(0, str(ROOT))

JOB = "pageview_counts"


class Readers(threading.Thread):
    """Readers of the alias by key; each converts at its serving version's true rate."""

    def __init__(self, settings: Any, schema: str, keys: list[str], rates: dict[str, float],
                 per_s: int, seed: int):
        super().__init__(daemon=True)
        self.settings, self.schema, self.keys, self.rates = settings, schema, keys, rates
        self.per_tick, self.seed = max(1, per_s // 10), seed
        self.halt = threading.Event()
        self.served: dict[str, int] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.seed)
        view = sql.SQL("{}.{}").format(sql.Identifier(self.settings.serving_schema),
                                       sql.Identifier(JOB))
        table = sql.SQL("{}.outcomes").format(sql.Identifier(self.schema))
        try:
            with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
                while not self.halt.wait(0.1):
                    drawn = [(rng.choice(self.keys), rng.random()) for _ in range(self.per_tick)]
                    serving = dict(conn.execute(sql.SQL(
                        "SELECT url, served_by FROM {} WHERE url = ANY(%s)").format(view),
                        ([k for k, _ in drawn],)).fetchall())
                    with conn.cursor().copy(sql.SQL(
                            "COPY {} (key, converted) FROM STDIN").format(table)) as copy:
                        for key, u in drawn:
                            version = serving[key]
                            self.served[version] = self.served.get(version, 0) + 1
                            copy.write_row((key, int(u < self.rates[version])))
        except BaseException as exc:
            self.failure = exc


def main() -> int:
    from bench.stack import bench_stack
    from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
    from orchestrator.service import Orchestrator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=["ab", "bandit"], default="bandit")
    parser.add_argument("--rates", type=float, nargs=2, default=[0.30, 0.345],
                        metavar=("V1", "V2"), help="each version's true conversion rate")
    parser.add_argument("--readers-per-s", type=int, default=400)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    flags = ["--strategy", args.strategy, "--metric", "converts", "--look-seconds", "1",
             "--min-per-arm", "200", "--mixture-sd", "0.2", "--pre-period", "0",
             "--start-percent", "10", "--max-duration", "180",
             *(["--min-percent", "5", "--max-percent", "90", "--max-step", "10"]
               if args.strategy == "bandit" else [])]
    with bench_stack("cutover", serving=True) as (plain, _, workdir, tag):
        settings = replace(plain, alias_version_column="served_by")
        service = Orchestrator(settings)
        topic = f"bench_cutover_{tag}"
        service.produce_sample(topic, 4_000, seed=221)
        for version in ("v1", "v2"):
            source = (ROOT / "jobs" / JOB / f"{version}.py").read_text()
            path = workdir / f"{version}.py"
            path.write_text(re.sub(r"^TOPICS = .*$", f'TOPICS = ["{topic}"]', source,
                                   flags=re.M))
            service.deploy(path)
        for version in ("v1", "v2"):
            service.wait(JOB, version, timeout_s=600)
        service.diff(JOB, "v1", "v2")
        service.promote(JOB, "v1", force=True, reason="cutover trace starts on v1")
        app_schema = f"app_bench_{tag}"
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
            conn.execute(sql.SQL(
                "CREATE TABLE {}.outcomes (key text NOT NULL, converted int NOT NULL, "
                "observed_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(
                sql.Identifier(app_schema)))
            keys = [r[0] for r in conn.execute(sql.SQL(
                "SELECT url FROM {d}.{a} INTERSECT SELECT url FROM {d}.{b} ORDER BY 1").format(
                d=sql.Identifier(settings.data_schema), a=sql.Identifier(f"{JOB}__v1"),
                b=sql.Identifier(f"{JOB}__v2")))]
        service.outcomes.define(JOB, OutcomeMetric(
            "converts", Kind.PROPORTION, True, Role.DECISION,
            sql=f"SELECT key, converted AS value, observed_at FROM {app_schema}.outcomes "
                "WHERE observed_at >= {since}"))
        rates = dict(zip(("v1", "v2"), args.rates, strict=True))
        readers = Readers(settings, app_schema, keys, rates, args.readers_per_s, args.seed)
        readers.start()
        try:
            command = [str(Path(sys.executable).with_name("kappa")), "cutover", JOB, "v2",
                       *flags]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                  check=False, env={**os.environ, **settings.driver_environment()})
        finally:
            readers.halt.set()
            readers.join(30)
        found = service.outcomes.experiment(JOB)
        try:
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
                    sql.Identifier(app_schema)))
        finally:
            service.close()
    if readers.failure is not None:
        raise RuntimeError(f"the readers failed: {readers.failure!r}")
    result = {"source": "a real run of kappa cutover on an embedded stack",
              "cutover_command": " ".join(["kappa cutover", JOB, "v2", *flags]),
              "true_rates": rates, "readers_per_s": args.readers_per_s, "keys": len(keys),
              "exit_code": done.returncode, "stderr_tail": done.stderr.strip()[-400:],
              "served": readers.served, "experiment": found}
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        for look in (found or {}).get("looks", []):
            print(f"look {look['look']:>3} {look['percent']:>3} % -> {look['next_percent']:>3} "
                  f"% {look['verdict']:10} {look['reason']}")
        print(f"exit {done.returncode}; served {readers.served}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
