"""Replay benchmark: end-to-end replay rate against the raw read rate, measured in one run.

    .venv/bin/python bench/replay.py [--count 1000000] [--json]

Starts its own embedded stack in a temporary directory (or uses KAPPA_PG_DSN and
KAPPA_KAFKA_BOOTSTRAP), produces COUNT sample events into a new 4-partition topic, then:
1. reads the whole topic with confluent-kafka alone in one process (no decoding): the raw rate;
2. deploys a new version of pageview_counts v2 on that topic and waits until it has caught up:
   records/s from the deploy call (Spark start included) and from the moment the driver's Spark
   session was up (`replaying`) to `caught_up` (start excluded).
It prints the rates and their ratios; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition
from psycopg import sql

from orchestrator.catalog.db import connect

ROOT = Path(__file__).resolve().parents[1]


def raw_read_rate(bootstrap: str, topic: str, expected: int) -> float:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        # The single-big-reader tuning measured on Tansu (shared/ENVIRONMENT.md).
        "fetch.max.bytes": 50 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 262144, "queued.min.messages": 1000000,
        "fetch.wait.max.ms": 100,
    })
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    began = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    pending, seen = set(partitions), 0
    while pending:
        for msg in consumer.consume(10000, 1.0):
            err = msg.error()
            if err is None:
                seen += 1
            elif err.code() == KafkaError._PARTITION_EOF:
                pending.discard(msg.partition())
            else:
                raise RuntimeError(err)
    elapsed = time.perf_counter() - began
    consumer.close()
    if seen != expected:
        raise RuntimeError(f"raw reader saw {seen} records, expected {expected}")
    return seen / elapsed


def job_file(directory: Path, topic: str, version: str) -> Path:
    source = (ROOT / "jobs" / "pageview_counts" / "v2.py").read_text()
    source = re.sub(r"^TOPICS = .*$", f'TOPICS = ["{topic}"]', source, flags=re.M)
    source = re.sub(r"^VERSION = .*$", f'VERSION = "{version}"', source, flags=re.M)
    path = directory / f"bench_{version}.py"
    path.write_text(source)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
    from bench.stack import bench_stack

    with bench_stack("replay") as (settings, service, workdir, tag):
        topic, version = f"bench_{tag}", f"b{tag}"
        produced = service.produce_sample(topic, args.count, seed=1)
        raw = raw_read_rate(settings.kafka_bootstrap or "", topic, produced)

        began = time.perf_counter()
        service.deploy(job_file(workdir, topic, version))
        status = service.wait("pageview_counts", version, timeout_s=1800, poll_s=0.5)
        wall = time.perf_counter() - began
        replay_s = spark_up_to_caught_up(settings, version)
        results = {
            "records": produced,
            "raw_read_records_per_s": round(raw),
            "replay_records_per_s_with_start": round(produced / wall),
            "replay_records_per_s_without_start": round(produced / replay_s),
            "ratio_with_start": round(produced / wall / raw, 4),
            "ratio_without_start": round(produced / replay_s / raw, 4),
            "deploy_to_caught_up_s": round(wall, 2),
            "spark_up_to_caught_up_s": round(replay_s, 2),
            "dead_letters": status.dead_letters,
        }
        service.stop("pageview_counts", version)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key:36} {value:>14,}" if isinstance(value, int) else f"{key:36} {value:>14}")
    return 0


def spark_up_to_caught_up(settings, version: str) -> float:  # type: ignore[no-untyped-def]
    with connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT detail->>'to', at FROM {}.events WHERE version = %s AND kind = 'state' "
            "ORDER BY id").format(sql.Identifier(settings.catalog_schema)), (version,)).fetchall()
    at = {to: when for to, when in rows}
    return (at["caught_up"] - at["replaying"]).total_seconds()


if __name__ == "__main__":
    sys.exit(main())
