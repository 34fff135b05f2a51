"""Timestamps of the records at given offsets: the age of the oldest unprocessed record is the
time lag of a version."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from orchestrator.kafka.admin import DEFAULT_TIMEOUT_S, base_config, kafka_errors
from orchestrator.kafka_endpoint import Kafka

Position = tuple[str, int]


def record_timestamps(bootstrap: Kafka, positions: Mapping[Position, int],
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[Position, int]:
    """Timestamp (ms) of the first record at or after each offset; partitions with no record
    there (the offset is the log end) are left out."""
    if not positions:
        return {}
    found: dict[Position, int] = {}
    with kafka_errors("reading record timestamps", bootstrap):
        consumer = Consumer({
            **base_config(bootstrap), "group.id": f"kappa-lag-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # One record per partition is all we need.
            "fetch.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
            "message.max.bytes": 65536,
            "queued.min.messages": 1, "fetch.wait.max.ms": 5, "fetch.queue.backoff.ms": 1,
        })
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
            pending = set(positions)
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                key = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(key)
                    continue
                if key in pending:
                    found[key] = msg.timestamp()[1]
                    pending.discard(key)
                    consumer.pause([TopicPartition(*key)])
        finally:
            consumer.close()
    return found
