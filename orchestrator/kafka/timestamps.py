"""Timestamps of the records at given offsets: the age of the oldest unprocessed record is the
time lag of a version."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from orchestrator.kafka.admin import DEFAULT_TIMEOUT_S, base_config, kafka_errors
from orchestrator.kafka.endpoint import Kafka

Position = tuple[str, int]


class TimestampReader:
    """Keeps one consumer to answer :meth:`read` repeatedly: an agent sampling every few seconds
    pays one connection, not one per sample. Not thread-safe: one reader per thread."""

    def __init__(self, bootstrap: Kafka, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.bootstrap, self.timeout_s = bootstrap, timeout_s
        self._consumer: Consumer | None = None

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            with kafka_errors("closing the timestamp consumer", self.bootstrap):
                consumer.close()

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                **base_config(self.bootstrap), "group.id": f"kappa-lag-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False, "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # One record per partition is all we need.
                "fetch.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
                "message.max.bytes": 65536,
                # Every position asked about holds a record; below 100 ms Tansu's durable storage
                # answers with none (see kafka/reader.py).
                "queued.min.messages": 1, "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 1,
            })
        return self._consumer

    def read(self, positions: Mapping[Position, int], *, reuse: bool = True
             ) -> dict[Position, int]:
        """Timestamp (ms) of the first record at or after each offset; partitions with no
        record there (the offset is the log end) are left out. ``reuse=False``: the consumer is
        closed next, so it is not reset for another call."""
        if not positions:
            return {}
        found: dict[Position, int] = {}
        with kafka_errors("reading record timestamps", self.bootstrap):
            consumer = self._client()
            assigned = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
            try:
                consumer.assign(assigned)
                pending = set(positions)
                deadline = time.monotonic() + self.timeout_s
                while pending and time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is None:
                        continue
                    key = (msg.topic(), msg.partition())
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF and key in pending \
                                and (msg.offset() or 0) >= positions[key]:
                            pending.discard(key)
                        continue
                    # A record fetched for an earlier call's position is not this one's answer.
                    if key in pending and (msg.offset() or 0) >= positions[key]:
                        found[key] = msg.timestamp()[1]
                        pending.discard(key)
                        consumer.pause([TopicPartition(*key)])
            except BaseException:
                self.close()  # a consumer in an unknown state is not reused
                raise
            if reuse:  # the next call starts from nothing paused and nothing assigned
                consumer.resume(assigned)
                consumer.unassign()
        return found


def record_timestamps(bootstrap: Kafka, positions: Mapping[Position, int],
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[Position, int]:
    """:meth:`TimestampReader.read` with a throw-away consumer."""
    reader = TimestampReader(bootstrap, timeout_s=timeout_s)
    try:
        return reader.read(positions, reuse=False)
    finally:
        reader.close()
