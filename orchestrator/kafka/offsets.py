"""True (log start, log end) per partition, on the Tansu broker and on a real Kafka alike.

Everything the orchestrator reads, it reads ``read_committed``: records of aborted transactions
are skipped (by a real Kafka; Tansu does not filter them), and the log end is the *last stable
offset* (LSO): the first offset of a transaction still open, else the high watermark. A batch
never reaches past it, so a reader never waits on a transaction.

The LSO is where a ``read_committed`` Fetch reports the end of the partition (librdkafka's
partition-EOF event). It is found in two steps:

1. ListOffsets(earliest), and ListOffsets(latest) in both isolation levels. On a real Kafka the
   read_committed answer *is* the LSO. Tansu answers 0 to it, and its read_uncommitted answer is
   too low after a produce request that carried several records (5 single produces then one
   batch of 10 give 6, not 15); either is a lower bound of the end.
2. Fetch every partition from the highest candidate with one read_committed consumer
   (``assign``, no group protocol, ``enable.partition.eof``) until it reports the partition's
   end; records before it are dropped. A candidate above the LSO (an open transaction, on a real
   Kafka) gets no answer: after a short wait the partition is fetched again from the next lower
   candidate (the last end found, then the log start).

:class:`LogEndProbe` keeps that consumer open for repeated calls (a streaming source asks every
micro-batch; a new consumer costs ~0.1 s). :func:`log_bounds` is the one-shot form.
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
from orchestrator.kafka_endpoint import Kafka

__all__ = ["Bounds", "LogEndProbe", "log_bounds"]

# {(topic, partition): (log start, log end)}; log end = offset the next record will get.
Bounds = dict[tuple[str, int], tuple[int, int]]

# Errors that only say the connection is (temporarily) gone: keep polling until the deadline.
_TRANSIENT = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError._RESOLVE, KafkaError._TIMED_OUT})


def _probe_config(bootstrap: Kafka) -> dict[str, Any]:
    return {
        **base_config(bootstrap),
        # Required by the client; no group is joined (assign only) and nothing is committed.
        "group.id": f"kappa-log-end-probe-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        "isolation.level": "read_committed",
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

    def __init__(self, bootstrap: Kafka, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._consumer: Consumer | None = None
        # ListOffsets(latest) read_uncommitted needs a client of that isolation level. A consumer,
        # not an AdminClient: AdminClient.list_offsets crashed the process here (a segfault in
        # confluent-kafka 2.16), while consumers' ListOffsets have been steady.
        self._uncommitted: Consumer | None = None
        self._last_end: dict[tuple[str, int], int] = {}  # a lower bound of the end, next call

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
        for consumer in (self._consumer, self._uncommitted):
            if consumer is not None:
                with kafka_errors("closing the log-end consumer", self.bootstrap):
                    consumer.close()
        self._consumer = self._uncommitted = None

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

    def _list_offsets(self, tps: list[tuple[str, int]], which: int, *,
                      committed: bool = True) -> dict[tuple[str, int], int]:
        consumer = self._client() if committed else self._uncommitted_client()
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

    def _uncommitted_client(self) -> Consumer:
        if self._uncommitted is None:
            with kafka_errors("creating the log-end consumer", self.bootstrap):
                self._uncommitted = Consumer({**_probe_config(self.bootstrap),
                                              "isolation.level": "read_uncommitted"})
        return self._uncommitted

    def bounds(self, topics: Sequence[str]) -> Bounds:
        """{(topic, partition): (log start, last stable offset)} for every partition of
        ``topics``."""
        if isinstance(topics, str):
            raise KappaError(f"bounds() takes a list of topic names, not the string {topics!r}")
        tps = [(t, p) for t in dict.fromkeys(topics) for p in self.partitions(t)]
        if not tps:
            return {}
        starts = self._list_offsets(tps, OFFSET_BEGINNING)
        committed = self._list_offsets(tps, OFFSET_END)  # the LSO on Kafka, 0 on Tansu
        uncommitted = self._list_offsets(tps, OFFSET_END, committed=False)  # Tansu's bound
        ladders = {tp: candidate_ladder(starts[tp], committed[tp], uncommitted[tp],
                                        self._last_end.get(tp)) for tp in tps}
        # A Fetch response's end offset as the client keeps it is the high watermark, not the
        # LSO: it may stand for the end only where no transaction was seen open (both
        # ListOffsets answers agree: on a real Kafka, where the read_committed one is the LSO;
        # and on Tansu's durable storage, which answers 1 to both).
        told = {tp for tp in tps if committed[tp] == uncommitted[tp]}
        ends: dict[tuple[str, int], int] = {}
        rung = 0
        while len(ends) < len(tps):
            pending = {tp: ladder[min(rung, len(ladder) - 1)] for tp, ladder in ladders.items()
                       if tp not in ends}
            last = all(rung >= len(ladders[tp]) - 1 for tp in pending)
            ends.update(self._fetch_ends(pending, self.timeout_s if last else _RUNG_WAIT_S,
                                         final=last, told=told))
            rung += 1
        for tp in tps:
            self._last_end[tp] = ends[tp]
        return {tp: (starts[tp], max(ends[tp], starts[tp])) for tp in tps}

    @staticmethod
    def _ends_told(consumer: Consumer, candidates: dict[tuple[str, int], int],
                   ends: dict[tuple[str, int], int], paused: list[TopicPartition],
                   baseline: dict[tuple[str, int], int], settled: bool) -> None:
        """Ends that Fetch responses told, without reading on to the EOF event.

        Every Fetch response carries the partition's high watermark, records or not: Tansu's
        durable storage answers a Fetch it cannot serve within fetch.wait.max.ms with no
        records and the watermark, and would never deliver the EOF event below the end. The
        client keeps the last value across assignments: until this assignment has had time for
        Fetch answers (``settled``), only a value that changed since it (``baseline``) counts."""
        for key, candidate in candidates.items():
            if key in ends or key not in baseline:
                continue
            _, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            if high > candidate and (settled or high != baseline[key]):
                ends[key] = high
                # Fetches go to the partitions still unanswered.
                paused.append(TopicPartition(*key))
                consumer.pause(paused[-1:])

    def _fetch_ends(
        self, candidates: dict[tuple[str, int], int], wait_s: float, *, final: bool,
        told: set[tuple[str, int]] | None = None,
    ) -> dict[tuple[str, int], int]:
        """Fetch each partition from its candidate until the Fetch reports its end (the LSO).

        Partitions with no answer within ``wait_s`` (a candidate above the LSO) are left out,
        unless ``final``: then the silence is an error."""
        consumer = self._client()
        doing = "fetching the log ends"
        ends: dict[tuple[str, int], int] = {}
        paused: list[TopicPartition] = []
        last_error: KafkaError | None = None
        deadline = time.monotonic() + wait_s
        with kafka_errors(doing, self.bootstrap):
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in candidates.items()])
            assigned_at = time.monotonic()
            baseline = {key: consumer.get_watermark_offsets(TopicPartition(*key), cached=True)[1]
                        for key in candidates if key in (told or ())}
            try:
                while len(ends) < len(candidates):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        if not final:
                            break
                        missing = sorted(set(candidates) - set(ends))
                        if last_error is not None:
                            raise translate(last_error, doing, self.bootstrap)
                        raise ServiceUnavailableError(
                            f"the Kafka broker at {self.bootstrap} sent no Fetch answer for "
                            f"{missing} within {wait_s:g} s: check that it is running "
                            "(`kappa dev up`) and its log, then retry"
                        )
                    # consume() waits for a full batch or its timeout; poll() returns at once.
                    msgs = consumer.consume(1000, timeout=0)
                    if not msgs:
                        one = consumer.poll(min(remaining, 0.01))
                        msgs = [] if one is None else [one]
                    self._ends_told(consumer, candidates, ends, paused, baseline,
                                    time.monotonic() - assigned_at >= _TOLD_SETTLE_S)
                    for msg in msgs:
                        err = msg.error()
                        if err is None:
                            continue  # a record below the end: its Fetch told the end too
                        if err.code() != KafkaError._PARTITION_EOF:
                            if err.code() in _TRANSIENT:
                                last_error = err
                                continue
                            raise translate(err, f"{doing} of {msg.topic()}/{msg.partition()}",
                                            self.bootstrap)
                        key = (msg.topic() or "", msg.partition() or 0)
                        offset = msg.offset()
                        if key in candidates and key not in ends and offset is not None:
                            ends[key] = offset
                            # No later Fetch may move its kept watermark past this end.
                            paused.append(TopicPartition(*key))
                            consumer.pause(paused[-1:])
            finally:
                if paused:  # a pause outlives the assignment: the next call would hang
                    consumer.resume(paused)
                consumer.unassign()
        return ends


# How long a candidate above the end may stay unanswered before the next lower one is tried.
_RUNG_WAIT_S = 0.5
# After this long, Fetch answers of an assignment have come in (polled every 10 ms).
_TOLD_SETTLE_S = 0.3


def candidate_ladder(start: int, committed: int, uncommitted: int, last_end: int | None
                     ) -> list[int]:
    """Where to fetch a partition's end from, highest first; each a lower bound of the end
    unless a transaction is open. The last rung, the log start, always works."""
    rungs = sorted({max(start, committed, uncommitted, last_end or 0),
                    max(start, committed, last_end or 0), max(start, last_end or 0), start},
                   reverse=True)
    return rungs


def log_bounds(
    bootstrap: Kafka, topics: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> Bounds:
    """{(topic, partition): (log start, log end)} with a throw-away consumer (~0.1 s)."""
    with LogEndProbe(bootstrap, timeout_s=timeout_s) as probe:
        return probe.bounds(topics)

