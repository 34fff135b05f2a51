"""Archiver benchmark: its CPU per million records, against a plain read of the same log.

    .venv/bin/python bench/archive.py [--count 1000000] [--segment-records 100000] [--json]

Starts its own embedded stack (or uses KAPPA_PG_DSN and KAPPA_KAFKA_BOOTSTRAP), produces COUNT
sample page views, then, in this process and one after the other:
1. reads every partition's full range as the archiver does (the limit: same reader, no writing);
2. archives the topic once (`kappa archive run --once`): read, checksum, Parquet, manifest;
3. reads every segment back from Parquet.
It prints wall and CPU seconds of each, CPU seconds per million records, the archive's ratio to
the plain read, and the archive's bytes per record. Compare figures of one run only: the
machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _timed(work: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--segment-records", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT)]
    from bench.stack import bench_stack, report
    from orchestrator.archive.archiver import Archiver, read_archived
    from orchestrator.catalog import archive_manifest
    from orchestrator.catalog.db import connect
    from orchestrator.kafka.offsets import log_bounds

    results: dict[str, Any] = {"count": args.count, "segment_records": args.segment_records}
    with bench_stack("archive") as (stack_settings, stack_service, _workdir, tag):
        settings = replace(stack_settings, archive_segment_records=args.segment_records)
        service = type(stack_service)(settings)
        topic = f"pageviews_{tag}"
        service.produce_sample(topic, args.count, seed=1)
        bounds = log_bounds(settings.kafka, [topic])
        group = f"bench-archive-{uuid.uuid4().hex[:8]}"

        def plain_read() -> int:
            n = 0
            for (name, partition), (start, end) in bounds.items():
                for first in range(start, end, args.segment_records):
                    n += len(read_archived(settings.kafka, name, partition, first,
                                           min(end, first + args.segment_records), group))
            return n

        read, wall, cpu = _timed(plain_read)
        results["plain_read"] = {"records": read, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
        written, wall, cpu = _timed(lambda: service.archive([topic], once=True))
        results["archive"] = {"segments": written, "wall_s": round(wall, 2),
                              "cpu_s": round(cpu, 2),
                              "cpu_s_per_million": round(cpu / args.count * 1e6, 2)}
        with connect(settings.pg_dsn or "", autocommit=True) as conn:
            segments = archive_manifest.segments(conn, settings.catalog_schema)
            store = Archiver(settings, conn, settings.kafka).store
            back, wall, cpu = _timed(lambda: sum(len(store.read(s.path)) for s in segments))
        results["read_back"] = {"records": back, "wall_s": round(wall, 2),
                                "cpu_s": round(cpu, 2)}
        size = sum(s.bytes for s in segments)
        results["bytes_per_record"] = round(size / max(1, sum(s.records for s in segments)), 1)
        results["archive_cpu_over_plain_read"] = round(
            results["archive"]["cpu_s"] / max(results["plain_read"]["cpu_s"], 1e-9), 2)
        assert read == back == sum(s.records for s in segments), (read, back)
    report(results, args.json, width=28)
    return 0


if __name__ == "__main__":
    sys.exit(main())
