"""A log written as applications write it, on the embedded default (`kappa dev up`): the broker
keeps it in memory, the stack's archiver keeps its durable copy.

    .venv/bin/python bench/steady.py [--count 3000000] [--rate 15000] [--live-rate 5000]
                                     [--live-seconds 600] [--json]

1. writes COUNT page views at a steady RATE records/s (`kappa produce-sample --rate`);
2. deploys pageview_counts v1 and v2, one after the other, and times each to caught up;
3. the same two replays on `kappa dev up --memory` (the log written in bulk): the limit;
4. while a producer writes LIVE_RATE records/s for LIVE_SECONDS, samples every 2 s how far
   both versions (`kappa lag`) and the archive (`kappa archive status`) are behind, in seconds;
5. `kappa dev down`, `kappa dev up`, `kappa restart` of both: they go on from their offsets,
   their output equals a reference computed from the log, and a plain consumer reads the same
   records at the same offsets as before.
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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "pageviews"
JOB = "pageview_counts"


def _kappa(state: Path, *args: str, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    done = subprocess.run([str(Path(sys.executable).with_name("kappa")), "--state-dir",
                           str(state), *args], env=env, capture_output=True, text=True,
                          check=False, timeout=7200)
    if check and done.returncode != 0:
        raise SystemExit(f"kappa {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _replays(state: Path) -> dict[str, float]:
    """Seconds from deploy to caught up, per version, one after the other."""
    took = {}
    for version in ("v1", "v2"):
        began = time.perf_counter()
        _kappa(state, "deploy", str(ROOT / "jobs" / JOB / f"{version}.py"), "--wait",
               "--timeout", "3600")
        took[version] = round(time.perf_counter() - began, 1)
    return took


def _behind(state: Path) -> tuple[list[float | None], float | None]:
    lags = json.loads(_kappa(state, "lag", JOB, "--json"))
    versions = [v.get("lag_seconds") for v in lags]
    rows = json.loads(_kappa(state, "archive", "status", TOPIC, "--json"))
    ages = [r["lag_seconds"] for r in rows if r["current"]]
    archive = None if not ages or None in ages else max(ages)
    return versions, archive


def _live(state: Path, rate: float, seconds: float) -> dict[str, Any]:
    producer = threading.Thread(target=_kappa, args=(state, "produce-sample", "--topic", TOPIC,
                                                     "--count", str(int(rate * seconds)),
                                                     "--rate", f"{rate:g}", "--seed", "9"))
    producer.start()
    version_lags: list[float] = []
    archive_lags: list[float] = []
    unknown = samples = 0
    time.sleep(5)  # the first records reach the versions
    failures: list[str] = []
    while producer.is_alive():
        try:
            versions, archive = _behind(state)
        except SystemExit as exc:  # a sample that failed is a figure unknown, and said
            failures.append(str(exc)[:300])
            versions, archive = [None], None
        samples += 1
        if None in versions or archive is None:
            unknown += 1
        version_lags.extend(v for v in versions if v is not None)
        if archive is not None:
            archive_lags.append(archive)
        time.sleep(2)
    producer.join()
    return {"samples": samples, "unknown_samples": unknown, "failed_samples": failures[:5],
            "failed_sample_count": len(failures),
            "versions_max_lag_s": _quantile(version_lags, 1.0),
            "versions_p50_p90_p99_lag_s": [_quantile(version_lags, q) for q in (.5, .9, .99)],
            "versions_samples_over_5s": sum(lag > 5 for lag in version_lags),
            "archive_max_lag_s": _quantile(archive_lags, 1.0),
            "archive_p50_p90_lag_s": [_quantile(archive_lags, q) for q in (.5, .9)]}


def _quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile; None (unknown) without samples."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 1)


def _exact(state: Path) -> bool:
    sys.path[:0] = [str(ROOT / "tests")]
    from orchestrator.settings import load_settings

    from integration.helpers import output
    from reference import compute

    settings = load_settings({"state_dir": str(state)}, env={}, cwd=state)
    ref = compute(settings.kafka_bootstrap or "", TOPIC)
    return bool(output(settings, f"{JOB}__v1") == ref.v1 and
                output(settings, f"{JOB}__v2") == ref.v2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3_000_000)
    parser.add_argument("--rate", type=float, default=15_000)
    parser.add_argument("--live-rate", type=float, default=5_000)
    parser.add_argument("--live-seconds", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from bench.stack import report

    from reference import read_records

    results: dict[str, Any] = {"count": args.count, "rate": args.rate}
    memory = Path(tempfile.mkdtemp(prefix="kappa-bench-steady-memory-"))
    state = Path(tempfile.mkdtemp(prefix="kappa-bench-steady-"))
    try:
        _kappa(memory, "dev", "up", "--memory")
        _kappa(memory, "produce-sample", "--topic", TOPIC, "--count", str(args.count))
        results["memory_bulk_replay_s"] = _replays(memory)
        print(json.dumps(results), file=sys.stderr, flush=True)
        _kappa(memory, "dev", "down")

        up = json.loads(_kappa(state, "dev", "up", "--json"))
        began = time.perf_counter()
        _kappa(state, "produce-sample", "--topic", TOPIC, "--count", str(args.count),
               "--rate", f"{args.rate:g}")
        results["produce_s"] = round(time.perf_counter() - began, 1)
        results["archived_steady_replay_s"] = _replays(state)
        results["replay_rate_ratio_to_memory"] = {
            v: round(results["memory_bulk_replay_s"][v] / results["archived_steady_replay_s"][v],
                     2) for v in ("v1", "v2")}
        print(json.dumps(results), file=sys.stderr, flush=True)
        results["live"] = _live(state, args.live_rate, args.live_seconds)
        print(json.dumps(results), file=sys.stderr, flush=True)
        _kappa(state, "wait", JOB, "v1", "--timeout", "600")
        _kappa(state, "wait", JOB, "v2", "--timeout", "600")
        before = read_records(up["kafka_bootstrap"], TOPIC)
        began = time.perf_counter()
        _kappa(state, "dev", "down")
        _kappa(state, "dev", "up")
        results["down_up_s"] = round(time.perf_counter() - began, 1)
        results["same_records_after_up"] = read_records(up["kafka_bootstrap"], TOPIC) == before
        for version in ("v1", "v2"):
            _kappa(state, "restart", JOB, version)
        _kappa(state, "produce-sample", "--topic", TOPIC, "--count", "20000", "--seed", "10")
        for version in ("v1", "v2"):
            _kappa(state, "wait", JOB, version, "--timeout", "600")
        statuses = json.loads(_kappa(state, "status", "--json"))
        results["attempts_after_restart"] = {s["version"]: s["attempt"] for s in statuses}
        results["output_exact_after_restart"] = _exact(state)
    finally:
        for where in (memory, state):
            _kappa(where, "dev", "down", check=False)
            shutil.rmtree(where, ignore_errors=True)
    report(results, as_json=args.json, width=30)
    print(json.dumps(results), file=sys.stderr)
    return 0 if results.get("output_exact_after_restart") else 1


if __name__ == "__main__":
    raise SystemExit(main())
