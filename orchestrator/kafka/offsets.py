"""True (log start, log end) per partition, on the Tansu broker and on a real Kafka alike.

Tansu quirk: ListOffsets(latest) answers too low after a produce request that carried several
records (5 single produces then one batch of 10 give 6, not 15), while the high watermark in a
Fetch response is right. So the log end is found in two steps:

1. ListOffsets(earliest) and ListOffsets(latest) for all partitions (two batched requests). The
   latest value is a lower bound of the end (exact on a real Kafka).
2. Fetch every partition from that candidate with one consumer (``assign``, no group protocol,
   ``enable.partition.eof``) until each partition has delivered a record or a partition-EOF
   event. The high watermark of that Fetch response (``get_watermark_offsets(cached=True)``, or
   the EOF event's offset) is the end. Records that come back (the candidate was below the end)
   are dropped; the consumer is capped to small fetches and unassigned afterwards so it does
   not pull data between calls.

:class:`LogEndProbe` keeps that consumer open for repeated calls (a streaming source asks every
micro-batch; a new consumer costs ~0.1 s). :func:`log_bounds` is the one-shot form.

Isolation is ``read_uncommitted``: the end is the high watermark, not the last stable offset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from orchestrator.errors import KappaError, NotFoundError, ServiceUnavailableError
from orchestrator.kafka.admin import DEFAULT_TIMEOUT_S, base_config, kafka_errors, translate

__all__ = ["Bounds", "LogEndProbe", "log_bounds"]

# {(topic, partition): (log start, log end)}; log end = offset the next record will get.
Bounds = dict[tuple[str, int], tuple[int, int]]

# Errors that only say the connection is (temporarily) gone: keep polling until the deadline.
_TRANSIENT = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError._RESOLVE, KafkaError._TIMED_OUT})


def _probe_config(bootstrap: str) -> dict[str, Any]:
    return {
        **base_config(bootstrap),
        # Required by the client; no group is joined (assign only) and nothing is committed.
        "group.id": f"kappa-log-end-probe-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        "isolation.level": "read_uncommitted",
        "auto.offset.reset": "error",
        # One small Fetch per partition is all we need; no prefetching beyond one record.
        "fetch.max.bytes": 65536,
        "message.max.bytes": 65536,
        "max.partition.fetch.bytes": 65536,
        "queued.min.messages": 1,
        "fetch.wait.max.ms": 5,  # an at-end Fetch waits this long for data (0 hangs Tansu)
        "fetch.error.backoff.ms": 10,
        # Default 1000: with queued.min.messages=1 a re-assigned partition would wait 1 s.
        "fetch.queue.backoff.ms": 1,
        "topic.metadata.refresh.interval.ms": 10000,
    }


class LogEndProbe:
    """Keeps one consumer open to answer :meth:`bounds` repeatedly (5-10 ms per call warm).

    The consumer is created on the first call and closed by :meth:`close` / ``with``. Not
    thread-safe: use one probe per thread.
    """

    def __init__(self, bootstrap: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._consumer: Consumer | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with kafka_errors("closing the log-end consumer", self.bootstrap):
                consumer.close()

    def _client(self) -> Consumer:
        if self._consumer is None:
            with kafka_errors("creating the log-end consumer", self.bootstrap):
                self._consumer = Consumer(_probe_config(self.bootstrap))
        return self._consumer

    def partitions(self, topic: str) -> list[int]:
        """Sorted partition ids of ``topic`` (NotFoundError if it does not exist).

        Uses the consumer's metadata request, which carries allow_auto_topic_creation=false and
        so does not create the topic, on Tansu either.
        """
        consumer = self._client()
        deadline = time.monotonic() + self.timeout_s
        doing = f"reading the metadata of topic {topic!r}"
        while True:
            with kafka_errors(doing, self.bootstrap):
                metadata = consumer.list_topics(topic, timeout=self.timeout_s)
            meta = metadata.topics.get(topic)
            err: KafkaError | None = None if meta is None else meta.error
            if meta is not None and err is None and meta.partitions:
                return sorted(meta.partitions)
            if meta is None or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise NotFoundError(
                    f"topic {topic!r} does not exist on the Kafka broker at {self.bootstrap}: "
                    "create it (e.g. by producing the sample events) or fix the topic name in "
                    "the job file"
                )
            if time.monotonic() >= deadline:  # e.g. LEADER_NOT_AVAILABLE right after creation
                raise translate(err if err is not None else "no partitions", doing, self.bootstrap)
            time.sleep(0.02)

    def _list_offsets(self, tps: list[tuple[str, int]], which: int) -> dict[tuple[str, int], int]:
        consumer = self._client()
        name = "earliest" if which == OFFSET_BEGINNING else "latest"
        doing = f"listing the {name} offsets"
        with kafka_errors(doing, self.bootstrap):
            # offsets_for_times with the special timestamps -2/-1 is ListOffsets(earliest/latest)
            # for all partitions in one request per leader.
            answer = consumer.offsets_for_times(
                [TopicPartition(t, p, which) for t, p in tps], timeout=self.timeout_s
            )
        out: dict[tuple[str, int], int] = {}
        for tp in answer:
            if tp.error is not None:
                raise translate(tp.error, f"{doing} of {tp.topic}/{tp.partition}", self.bootstrap)
            out[(tp.topic, tp.partition)] = tp.offset
        return out

    def bounds(self, topics: Sequence[str]) -> Bounds:
        """{(topic, partition): (log start, log end)} for every partition of ``topics``."""
        if isinstance(topics, str):
            raise KappaError(f"bounds() takes a list of topic names, not the string {topics!r}")
        tps = [(t, p) for t in dict.fromkeys(topics) for p in self.partitions(t)]
        if not tps:
            return {}
        starts = self._list_offsets(tps, OFFSET_BEGINNING)
        lower = self._list_offsets(tps, OFFSET_END)
        candidates = {tp: max(lower[tp], starts[tp], 0) for tp in tps}
        ends = self._fetch_high_watermarks(candidates)
        return {tp: (starts[tp], max(ends[tp], starts[tp])) for tp in tps}

    def _fetch_high_watermarks(
        self, candidates: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """Fetch each partition once from its candidate and return the Fetch high watermark."""
        consumer = self._client()
        doing = "fetching the high watermarks"
        ends: dict[tuple[str, int], int] = {}
        last_error: KafkaError | None = None
        deadline = time.monotonic() + self.timeout_s
        with kafka_errors(doing, self.bootstrap):
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in candidates.items()])
            try:
                while len(ends) < len(candidates):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        missing = sorted(set(candidates) - set(ends))
                        if last_error is not None:
                            raise translate(last_error, doing, self.bootstrap)
                        raise ServiceUnavailableError(
                            f"the Kafka broker at {self.bootstrap} sent no Fetch answer for "
                            f"{missing} within {self.timeout_s:g} s: check that it is running "
                            "(`kappa dev up`) and its log, then retry"
                        )
                    # consume() waits for a full batch or its timeout; poll() returns at once.
                    msgs = consumer.consume(1000, timeout=0)
                    if not msgs:
                        one = consumer.poll(min(remaining, 0.1))
                        msgs = [] if one is None else [one]
                    for msg in msgs:
                        err = msg.error()
                        topic, partition = msg.topic(), msg.partition()
                        if err is not None and err.code() != KafkaError._PARTITION_EOF:
                            if err.code() in _TRANSIENT:
                                last_error = err
                                continue
                            raise translate(err, f"{doing} of {topic}/{partition}", self.bootstrap)
                        if topic is None or partition is None:
                            continue
                        key = (topic, partition)
                        if key in ends or key not in candidates:
                            continue
                        _, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), cached=True
                        )
                        seen = msg.offset()
                        at_least = candidates[key] if seen is None else seen + (err is None)
                        ends[key] = max(high, at_least)
            finally:
                consumer.unassign()
        return ends


def log_bounds(
    bootstrap: str, topics: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> Bounds:
    """{(topic, partition): (log start, log end)} with a throw-away consumer (~0.1 s)."""
    with LogEndProbe(bootstrap, timeout_s=timeout_s) as probe:
        return probe.bounds(topics)

