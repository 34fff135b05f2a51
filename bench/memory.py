"""Driver memory benchmark: a clean replay, a flood of invalid events, and a million keys.

    .venv/bin/python bench/memory.py [--count 1000000] [--invalid-share 0.3] [--json]

Starts its own embedded stack (or uses KAPPA_PG_DSN and KAPPA_KAFKA_BOOTSTRAP), then replays,
one after the other so that each driver has the machine to itself:
1. COUNT clean page views with pageview_counts v2;
2. COUNT page views of which INVALID_SHARE are invalid, with the same job;
3. COUNT profile changes over COUNT users (one output row per user) with user_profiles v1.
For each it prints the driver's peak resident memory (the Python driver process and its JVM,
read from the kernel's high-water marks while the driver still runs) and checks the output: the
dead letters equal the invalid records, and the profile table equals the reference row for row.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from orchestrator.lag import Thresholds

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_mb(pid: int) -> dict[str, float]:
    """High-water resident set of a driver process and of the JVM it started, in MiB."""
    def hwm(process: psutil.Process) -> float:
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    driver = psutil.Process(pid)
    jvms = [p for p in driver.children(recursive=True) if p.name() == "java"]
    python_mb, jvm_mb = hwm(driver), sum(hwm(j) for j in jvms)
    return {"python_mb": round(python_mb, 1), "jvm_mb": round(jvm_mb, 1),
            "total_mb": round(python_mb + jvm_mb, 1)}


def job_copy(directory: Path, shipped: str, topic_names: dict[str, str], version: str) -> Path:
    source = (ROOT / shipped).read_text()
    for name, topic in topic_names.items():
        source = source.replace(f'"{name}"', f'"{topic}"')
    source = re.sub(r"^VERSION = .*$", f'VERSION = "{version}"', source, flags=re.M)
    path = directory / f"{Path(shipped).parent.name}_{version}.py"
    path.write_text(source)
    return path


def replay(service: Any, path: Path, job: str, version: str) -> dict[str, Any]:
    began = time.perf_counter()
    service.deploy(path)
    # A catch-up batch of 500,000 new keys can outlast the default 30 s lag window, which
    # would read as a stall: judge over a longer window.
    status = service.wait(job, version, timeout_s=3600, poll_s=1.0,
                          limits=Thresholds(window_s=600))
    seconds = time.perf_counter() - began
    memory = peak_rss_mb(status.pid)
    service.stop(job, version)
    return {"seconds": round(seconds, 1), "rows": status.rows,
            "dead_letters": status.dead_letters, **memory}


def invalid_records(bootstrap: str, topic: str) -> int:
    """Invalid page views in the log, by the tests' independent reference."""
    from reference_streams import read_records, valid_pageview

    return sum(valid_pageview(v) is None for *_, v in read_records(bootstrap, topic))


def profiles_match(settings: Any, topic: str, table: str) -> bool:
    """Whether the output equals, row for row, the tests' independent reference."""
    from psycopg import sql

    from orchestrator.catalog.db import connect

    from reference_streams import Log, read_records, user_profiles

    reference = user_profiles(Log([], read_records(settings.kafka_bootstrap, topic)))
    with connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT user_id, plan, country, city, tags, updated_at FROM {}.{}").format(
            sql.Identifier(settings.data_schema), sql.Identifier(table))).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows} == reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--invalid-share", type=float, default=0.3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # run as a script; references in tests/
    from bench.stack import bench_stack, report

    results: dict[str, Any] = {"count": args.count, "invalid_share": args.invalid_share}
    with bench_stack("memory") as (settings, service, workdir, tag):
        clean, flood, profiles = f"clean_{tag}", f"flood_{tag}", f"profiles_{tag}"
        service.produce_sample(clean, args.count, seed=1, invalid_share=0.0)
        service.produce_sample(flood, args.count, seed=2, invalid_share=args.invalid_share)
        service.produce_sample(profiles, args.count, seed=3, kind="profiles", users=args.count)
        v2 = "jobs/pageview_counts/v2.py"
        results["clean"] = replay(service, job_copy(workdir, v2, {"pageviews": clean}, "clean"),
                                  "pageview_counts", "clean")
        results["flood"] = replay(service, job_copy(workdir, v2, {"pageviews": flood}, "flood"),
                                  "pageview_counts", "flood")
        results["many_keys"] = replay(
            service, job_copy(workdir, "jobs/user_profiles/v1.py", {"profiles": profiles}, "many"),
            "user_profiles", "many")
        results["flood"]["invalid_in_log"] = invalid_records(settings.kafka_bootstrap, flood)
        results["many_keys"]["equals_reference"] = profiles_match(settings, profiles,
                                                                  "user_profiles__many")
    results["flood_over_clean_peak"] = round(
        results["flood"]["total_mb"] / results["clean"]["total_mb"], 3)
    report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
