"""The consumer-group mirror: each version's processed offsets, committed to its own group.

The truth is the catalog (offsets commit with the output rows). Spark's sources commit nothing to
Kafka, so Burrow, kafka-lag-exporter and `kafka-consumer-groups` would see no lag; mirroring the
processed offsets to the group ``kappa.<job>.<version>`` lets them show the same lag we do.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from confluent_kafka import Consumer, TopicPartition

from orchestrator.kafka.admin import DEFAULT_TIMEOUT_S, base_config, kafka_errors
from orchestrator.kafka.endpoint import Kafka
from orchestrator.models import Offsets


def _config(bootstrap: Kafka, group: str) -> dict[str, Any]:
    # Commits only: no subscribe, so the group never rebalances and nothing is fetched.
    return {**base_config(bootstrap), "group.id": group, "enable.auto.commit": False,
            "enable.auto.offset.store": False}


class GroupMirror:
    """Commits offsets to one consumer group; the client is created on first use."""

    def __init__(self, bootstrap: Kafka, group: str) -> None:
        self.bootstrap, self.group = bootstrap, group
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()  # connect() may run on a thread of its own

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def connect(self) -> None:
        """Create the client now (a caller may do so on a thread of its own): it connects and
        finds the group's coordinator in the background, so that the first commit, after a
        replay's first batch, does not wait for that."""
        with self._lock, kafka_errors(f"connecting for group {self.group}", self.bootstrap):
            if self._consumer is None:
                self._consumer = Consumer(_config(self.bootstrap, self.group))

    def commit(self, offsets: Offsets) -> None:
        positions = [TopicPartition(t, int(p), o) for t, ps in offsets.items()
                     for p, o in ps.items()]
        if not positions:
            return
        self.connect()
        with kafka_errors(f"committing offsets of group {self.group}", self.bootstrap):
            assert self._consumer is not None
            self._consumer.commit(offsets=positions, asynchronous=False)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def committed_offsets(bootstrap: Kafka, group: str, partitions: Sequence[tuple[str, int]],
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> Offsets:
    """The group's committed offsets (partitions without a commit are left out)."""
    with kafka_errors(f"reading offsets of group {group}", bootstrap):
        consumer = Consumer(_config(bootstrap, group))
        try:
            found = consumer.committed([TopicPartition(t, p) for t, p in partitions],
                                       timeout=timeout_s)
        finally:
            consumer.close()
    result: Offsets = {}
    for tp in found:
        if tp.offset >= 0:
            result.setdefault(tp.topic, {})[str(tp.partition)] = tp.offset
    return result
