"""Independent reference for the sample job, computed from the log with plain Python.

Deliberately shares no code with the orchestrator: it reads Kafka with confluent-kafka directly,
validates with the standard json module and normalises URLs with string operations.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition


@dataclass
class Reference:
    records: int = 0
    invalid: int = 0
    invalid_offsets: set[tuple[int, int]] = field(default_factory=set)
    v1: dict[str, tuple[int, int]] = field(default_factory=dict)
    v2: dict[str, tuple[int, int]] = field(default_factory=dict)
    log_end: dict[int, int] = field(default_factory=dict)


# (partition, offset, timestamp_ms, key, value)
Record = tuple[int, int, int, bytes | None, bytes | None]


def read_records(bootstrap: str, topic: str, client: dict[str, str] | None = None
                 ) -> list[Record]:
    """Every record of ``topic``, sorted by (partition, offset). ``client`` adds librdkafka
    properties (TLS, SASL)."""
    consumer = Consumer({**(client or {}), "bootstrap.servers": bootstrap, "group.id": "reference",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.max.bytes": 1 << 20, "max.partition.fetch.bytes": 1 << 20})
    try:
        meta = consumer.list_topics(topic, timeout=10)
        partitions = sorted(meta.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending, out = set(partitions), []
        while pending:
            # Many messages per call: one call per message costs more CPU than the parse.
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    if msg.error().code() == -191:  # partition EOF
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(msg.error())
                out.append((msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(),
                            msg.value()))
        return sorted(out)
    finally:
        consumer.close()


def read_log(bootstrap: str, topic: str, client: dict[str, str] | None = None
             ) -> list[tuple[int, int, bytes | None]]:
    return [(p, o, v) for p, o, _, _, v in read_records(bootstrap, topic, client)]


def _valid(value: bytes | None) -> dict | None:
    try:
        event = json.loads(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not isinstance(event, dict):
        return None
    for name, kind in (("user_id", int), ("url", str), ("ts", int), ("duration_ms", int)):
        v = event.get(name)
        if name not in event or not isinstance(v, kind) or isinstance(v, bool):
            return None
    if event["duration_ms"] < 0:
        return None
    return event


def normalise(url: str) -> str:
    url = url.lower()
    for mark in ("?", "#"):
        url = url.split(mark, 1)[0]
    if url != "/" and url.endswith("/"):
        url = url[:-1]
    return url


def compute(bootstrap: str, topic: str, client: dict[str, str] | None = None) -> Reference:
    ref = Reference()
    v1: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    v2: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    ends: Counter[int] = Counter()
    for partition, offset, value in read_log(bootstrap, topic, client):
        ref.records += 1
        ends[partition] = max(ends[partition], offset + 1)
        event = _valid(value)
        if event is None:
            ref.invalid += 1
            ref.invalid_offsets.add((partition, offset))
            continue
        for table, url in ((v1, event["url"]), (v2, normalise(event["url"]))):
            table[url][0] += 1
            table[url][1] += event["duration_ms"]
    ref.v1 = {k: (a, b) for k, (a, b) in v1.items()}
    ref.v2 = {k: (a, b) for k, (a, b) in v2.items()}
    ref.log_end = dict(ends)
    return ref
