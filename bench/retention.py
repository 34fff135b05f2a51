"""Kappa+ at scale: a version deployed after retention took half of an archived topic replays
from offset 0 out of the archive, exactly, for a batch job, a stream job with state, and a
restart in the middle of the archive's part.

    .venv/bin/python bench/retention.py [--events 1000000] [--json]

In a temporary directory, on the S3-backed embedded stack (`kappa dev up --s3`):
1. produces EVENTS sample page views in ten runs, archives the topic (`kappa archive run
   --once`), and computes the references from the whole log: pageview_counts v1 and v2, the
   invalid offsets, and url_visitors;
2. applies retention while the broker is down: every batch object of a partition that lies
   wholly below half of the partition's end is removed, so the log start moves up to about
   half (../shared/ENVIRONMENT.md);
3. deploys, without --allow-gap: pageview_counts v1; url_visitors v1; and pageview_counts v2
   made to exit at a fail point after its second batch (a tenth of the events a batch), which
   stops it in the archive's part, then `kappa restart` of it.
It raises unless each output equals its reference, the dead letters equal the invalid records,
the batch records tile every partition from 0, and the archive served the offsets below its
end. It prints how long each step took; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "pageviews"


def kappa(state: Path, *args: str, check: bool = True, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    environment.update({"KAPPA_SPARK_DRIVER_MEMORY": "1g", **env})
    done = subprocess.run([str(Path(sys.executable).with_name("kappa")), "--state-dir",
                           str(state), *args], env=environment, capture_output=True, text=True,
                          timeout=3600, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"kappa {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def job_file(directory: Path, version: str) -> Path:
    source = (ROOT / "jobs" / "pageview_counts" / f"{version}.py").read_text()
    path = directory / f"pageview_counts_{version}.py"
    path.write_text(re.sub(r"^TOPICS = .*$", f'TOPICS = ["{TOPIC}"]', source, flags=re.M))
    return path


def retain_half(state: Path, ends: dict[int, int]) -> None:
    """Each partition's batch objects that lie wholly below half of its end are removed."""
    for partition in sorted(state.glob(f"**/topics/{TOPIC}/partitions/*")):
        objects: dict[int, list[Path]] = {}
        for part in partition.glob("records/*.batch*"):  # data, checksum, metadata files
            objects.setdefault(int(part.name.split(".")[0]), []).append(part)
        firsts = sorted(objects)
        half = ends[int(partition.name)] // 2
        for first, after in pairwise(firsts):
            if after <= half:
                for part in objects[first]:
                    part.unlink()


def timed(step: str, took: dict[str, float], work: Any) -> Any:
    began = time.perf_counter()
    result = work()
    took[step] = round(time.perf_counter() - began, 1)
    return result


def run(state: Path, workdir: Path, events: int) -> dict[str, Any]:
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.settings import load_settings

    from integration.helpers import assert_batches_tile_the_log, dead_letters, output, query
    from integration.stream_helpers import dead_letter_offsets, example, table
    from reference import compute
    from reference_streams import Log, read_records, url_visitors

    took: dict[str, float] = {}
    kappa(state, "dev", "up", "--s3")
    settings = load_settings({"state_dir": str(state)}, env={}, cwd=state)
    bootstrap = settings.kafka_bootstrap or ""
    timed("produce", took, lambda: [kappa(state, "produce-sample", "--topic", TOPIC, "--count",
                                          str(events // 10), "--seed", str(seed))
                                    for seed in range(10)])
    timed("archive_run_once", took, lambda: kappa(state, "archive", "run", TOPIC, "--once"))
    whole = timed("reference", took, lambda: compute(bootstrap, TOPIC))
    visitors = url_visitors(Log(read_records(bootstrap, TOPIC), []))
    ends = {p: end for (_, p), (_, end) in log_bounds(bootstrap, [TOPIC]).items()}
    kappa(state, "dev", "down")
    retain_half(state, ends)
    kappa(state, "dev", "up")
    starts = {p: first for (_, p), (first, _) in log_bounds(bootstrap, [TOPIC]).items()}
    if not all(0 < starts[p] <= ends[p] // 2 + ends[p] // 10 for p in ends):
        raise RuntimeError(f"retention did not take about half: log starts {starts}, ends {ends}")

    def archived(version: str, job: str = "pageview_counts") -> int:
        return int(query(settings, "SELECT coalesce(sum(b.archived_offsets), 0) FROM "
                         f"{settings.catalog_schema}.batches b JOIN {settings.catalog_schema}"
                         ".job_versions v ON v.id = b.version_id WHERE v.job = %s AND "
                         "v.version = %s", job, version)[0][0])

    def check_counts(version: str) -> None:
        table_name = f"pageview_counts__{version}"
        if output(settings, table_name) != getattr(whole, version):
            raise RuntimeError(f"pageview_counts {version}'s output differs from the reference")
        if dead_letters(settings, f"{table_name}__dead_letters") != whole.invalid_offsets:
            raise RuntimeError(f"pageview_counts {version}'s dead letters differ")
        assert_batches_tile_the_log(settings, "pageview_counts", version, TOPIC, whole.log_end)
        if archived(version) < sum(starts.values()):
            raise RuntimeError(f"{version} read {archived(version)} offsets from the archive, "
                               f"fewer than the {sum(starts.values())} below the log start")

    timed("pageview_counts_v1_deploy_to_caught_up", took, lambda: kappa(
        state, "deploy", str(job_file(workdir, "v1")), "--wait", "--timeout", "1800"))
    check_counts("v1")
    stream_job = example(workdir, "url_visitors", {"pageviews": TOPIC})
    timed("url_visitors_deploy_to_caught_up", took, lambda: kappa(
        state, "deploy", str(stream_job), "--wait", "--timeout", "1800"))
    if table(settings, "url_visitors__v1", "url", ["visitors", "first_seen", "last_seen"]) \
            != visitors:
        raise RuntimeError("url_visitors' table differs from the reference")
    if dead_letter_offsets(settings, "url_visitors__v1__dead_letters", TOPIC) != \
            whole.invalid_offsets:
        raise RuntimeError("url_visitors' dead letters differ")

    kappa(state, "deploy", str(job_file(workdir, "v2")), KAPPA_MAX_BATCH_RECORDS=str(
        events // 10), KAPPA_FAIL_POINTS="batch.after_pg_commit=1*off->1*exit")
    def v2() -> dict[str, Any]:
        return next(v for v in json.loads(kappa(state, "status", "--json"))
                    if (v["job"], v["version"]) == ("pageview_counts", "v2"))

    while v2()["state"] != "failed":
        time.sleep(1)
    stopped = v2()["processed_offsets"][TOPIC]
    if not all(int(at) < starts[int(p)] for p, at in stopped.items()):
        raise RuntimeError(f"v2 stopped at {stopped}, not below the log starts {starts}")
    timed("pageview_counts_v2_restart_to_caught_up", took, lambda: (
        kappa(state, "restart", "pageview_counts", "v2"),
        kappa(state, "wait", "pageview_counts", "v2", "--timeout", "1800")))
    check_counts("v2")
    return {"events": whole.records, "log_ends": ends, "log_starts_after_retention": starts,
            "v2_stopped_at": stopped, "offsets_read_from_archive": {
                "pageview_counts v1": archived("v1"), "url_visitors v1": archived(
                    "v1", "url_visitors"), "pageview_counts v2": archived("v2")},
            "dead_letters": len(whole.invalid_offsets), "outputs_equal_references": True,
            "seconds": took}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    # Stopped from outside (SIGTERM): the drivers and the stack are stopped all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="kappa-bench-retention-"))
    state = workdir / "state"
    try:
        results = run(state, workdir, args.events)
    finally:
        for job, version in (("pageview_counts", "v1"), ("pageview_counts", "v2"),
                             ("url_visitors", "v1")):
            kappa(state, "stop", job, version, check=False)
        kappa(state, "dev", "down", check=False)
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
