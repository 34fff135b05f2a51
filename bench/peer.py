"""The peer: what a user would hand-write instead of kappa to replay pageview_counts v1.

    .venv/bin/python bench/peer.py BOOTSTRAP TOPIC DSN [--schema public] [--table peer]

One process: read the whole topic with confluent-kafka, parse each value with orjson, skip (and
count) the records v1 would dead-letter, add up views and duration per URL exactly as v1 does
(the URL as it appears in the event), then COPY the result into SCHEMA.TABLE (replaced). The
yardstick bench/replay.py sets kappa's replay against; `replay()` is its API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition
from psycopg import sql

LONG = (-(2**63), 2**63 - 1)  # v1's "long" fields: a JSON integer (not a bool) in int64


def valid(event: Any) -> tuple[str, int] | None:
    """(url, duration_ms) if v1's EVENT_SCHEMA and NON_NEGATIVE accept the event, else None."""
    if type(event) is not dict:
        return None
    for name in ("user_id", "ts", "duration_ms"):
        v = event.get(name)
        if type(v) is not int or not LONG[0] <= v <= LONG[1]:
            return None
    url, duration = event.get("url"), event["duration_ms"]
    if type(url) is not str or duration < 0:
        return None
    return url, duration


def read(bootstrap: str, topic: str) -> tuple[dict[str, list[int]], int, int]:
    """({url: [views, total_duration_ms]}, records, invalid) over the whole topic."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"peer-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        # Tansu reads ~6x slower with librdkafka's defaults (shared/ENVIRONMENT.md).
        "fetch.max.bytes": 50 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 262144, "queued.min.messages": 1000000,
        "fetch.wait.max.ms": 100,
    })
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    totals: dict[str, list[int]] = {}
    pending, records, invalid = set(partitions), 0, 0
    while pending:
        # Short: consume() waits out its timeout unless the batch fills, also at the log end.
        for msg in consumer.consume(10000, 0.05):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(err)
                pending.discard(msg.partition())
                continue
            records += 1
            value = msg.value()
            try:
                row = valid(orjson.loads(value)) if value is not None else None
            except orjson.JSONDecodeError:
                row = None
            if row is None:
                invalid += 1
                continue
            acc = totals.get(row[0])
            if acc is None:
                totals[row[0]] = [1, row[1]]
            else:
                acc[0] += 1
                acc[1] += row[1]
    consumer.close()
    return totals, records, invalid


def write(dsn: str, schema: str, table: str, totals: dict[str, list[int]]) -> None:
    """Replace SCHEMA.TABLE with the totals, in one transaction."""
    target = sql.Identifier(schema, table)
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
        conn.execute(sql.SQL("CREATE TABLE {} (url text PRIMARY KEY, views bigint NOT NULL, "
                             "total_duration_ms bigint NOT NULL)").format(target))
        with conn.cursor().copy(sql.SQL(
                "COPY {} (url, views, total_duration_ms) FROM STDIN").format(target)) as copy:
            for url, (views, duration) in totals.items():
                copy.write_row((url, views, duration))


def replay(bootstrap: str, topic: str, dsn: str, schema: str, table: str) -> dict[str, Any]:
    began = time.perf_counter()
    totals, records, invalid = read(bootstrap, topic)
    write(dsn, schema, table, totals)
    return {"seconds": time.perf_counter() - began, "records": records, "invalid": invalid,
            "rows": len(totals)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("dsn")
    parser.add_argument("--schema", default="public")
    parser.add_argument("--table", default="peer")
    args = parser.parse_args()
    print(json.dumps(replay(args.bootstrap, args.topic, args.dsn, args.schema, args.table)))
    sys.exit(0)
