"""The embedded default's log: the broker's memory per million records, the archiver's
catch-up, `kappa dev down` and the restore at `kappa dev up`, against a plain read.

    .venv/bin/python bench/restore.py [--count 1000000] [--rate 0] [--json]

Starts its own embedded stack (the default storage: a memory log and the stack's archiver) in a
temporary directory, produces COUNT sample page views (at --rate records/s, or in bulk), then
measures, one after the other:
1. the broker's resident memory before and after, per million records;
2. how long the stack's archiver takes to reach the log end once the producer is done;
3. a plain read of the whole log (the limit: what reading the records costs);
4. `kappa dev down` (the archiver's last pass) and `kappa dev up` (the restore, checked);
5. the restored log, read again: it must be the same, record for record.
Compare figures of one run only: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "pageviews"


def _kappa(state: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    done = subprocess.run([str(Path(sys.executable).with_name("kappa")), "--state-dir",
                           str(state), *args], env=env, capture_output=True, text=True,
                          check=False, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"kappa {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _rss_mb(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).memory_info().rss) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=0.0, help="records/s; 0: in bulk")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from bench.stack import report

    from reference import read_records

    results: dict[str, Any] = {"count": args.count, "rate": args.rate or "bulk"}
    state = Path(tempfile.mkdtemp(prefix="kappa-bench-restore-"))
    try:
        up = json.loads(_kappa(state, "dev", "up", "--json"))
        pids = {s["name"]: s["pid"] for s in up["services"]}
        bootstrap = up["kafka_bootstrap"]
        empty_mb = _rss_mb(pids["broker"])
        began = time.perf_counter()
        produce = ["produce-sample", "--topic", TOPIC, "--count", str(args.count)]
        _kappa(state, *produce, *(["--rate", f"{args.rate:g}"] if args.rate else []))
        results["produce_s"] = round(time.perf_counter() - began, 2)
        results["broker_mb_per_million"] = round(
            (_rss_mb(pids["broker"]) - empty_mb) * 1e6 / args.count, 1)
        began = time.perf_counter()
        while True:
            rows = json.loads(_kappa(state, "archive", "status", TOPIC, "--json"))
            if rows and all(r["behind"] == 0 for r in rows):
                break
            time.sleep(0.2)
        results["archive_behind_after_produce_s"] = round(time.perf_counter() - began, 2)
        results["archive_segments"] = sum(r["segments"] for r in rows)
        results["archive_bytes_per_record"] = round(
            sum(r["bytes"] for r in rows) / args.count, 1)
        archiver = __import__("psutil").Process(pids["archiver"])
        results["archiver_cpu_s_per_million"] = round(
            sum(archiver.cpu_times()[:2]) * 1e6 / args.count, 2)

        began = time.perf_counter()
        before = read_records(bootstrap, TOPIC)
        results["plain_read_s"] = round(time.perf_counter() - began, 2)
        began = time.perf_counter()
        _kappa(state, "dev", "down")
        results["dev_down_s"] = round(time.perf_counter() - began, 2)
        began = time.perf_counter()
        _kappa(state, "dev", "up")
        results["dev_up_with_restore_s"] = round(time.perf_counter() - began, 2)
        results["restore_records_per_s"] = round(args.count / results["dev_up_with_restore_s"])
        results["restore_to_plain_read"] = round(
            results["dev_up_with_restore_s"] / results["plain_read_s"], 2)
        results["same_records_after_restore"] = read_records(bootstrap, TOPIC) == before
    finally:
        subprocess.run([str(Path(sys.executable).with_name("kappa")), "--state-dir", str(state),
                        "dev", "down"], capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
    report(results, as_json=args.json)
    return 0 if results.get("same_records_after_restore") else 1


if __name__ == "__main__":
    raise SystemExit(main())
