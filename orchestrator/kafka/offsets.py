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
from orchestrator.failpoints import fail_point
from orchestrator.kafka.admin import DEFAULT_TIMEOUT_S, base_config, kafka_errors, translate
from orchestrator.kafka.endpoint import Kafka

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
        # Reads from a lower bound of the end: on Tansu every Fetch below the end lists all the
        # partition's batches, so few and large ones. No prefetching beyond one record.
        "fetch.max.bytes": 1_048_576,
        "message.max.bytes": 1_048_576,
        "max.partition.fetch.bytes": 1_048_576,
        "queued.min.messages": 1,
        "fetch.wait.max.ms": 5,  # an at-end Fetch waits this long for data (0 hangs Tansu)
        # Tansu answers a Fetch after one pass over its store when the wait is this short: one
        # batch per partition, 600 records/s from a log written at a steady rate, which a probe
        # reading from a lower bound while a producer writes never catches up with. Asking for
        # a full answer makes it read on (166,000 records/s); at the end it answers at once.
        "fetch.min.bytes": 1_048_576,
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
        self._starts: dict[tuple[str, int], int] = {}
        self._starts_at = float("-inf")  # monotonic time of the last ListOffsets round
        self._rung_wait_s = _RUNG_WAIT_S

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
        ``topics``; ServiceUnavailableError where no read reached the end within the timeout
        (the end is then unknown, never a lower bound of it)."""
        if isinstance(topics, str):
            raise KappaError(f"bounds() takes a list of topic names, not the string {topics!r}")
        tps = [(t, p) for t in dict.fromkeys(topics) for p in self.partitions(t)]
        if not tps:
            return {}
        fresh = time.monotonic() - self._starts_at < _STARTS_KEPT_S
        if fresh and all(tp in self._last_end and tp in self._starts for tp in tps):
            found = self._ends_from_last(tps)
            if found is not None:
                return found
        return self._listed_bounds(tps)

    def _ends_from_last(self, tps: list[tuple[str, int]]) -> Bounds | None:
        """The ends fetched from the last ends found, with no ListOffsets: on Tansu each
        ListOffsets lists every batch of the partition, and a Fetch at the end lists none.
        None when a partition does not answer (a transaction opened, a recreated topic)."""
        try:
            ends, read_to = self._fetch_ends({tp: self._last_end[tp] for tp in tps},
                                             self._rung_wait_s, final=False)
        except KappaError:  # e.g. the last end is beyond a recreated topic's end
            self._last_end.clear()
            return None
        if len(ends) < len(tps):
            # Where records came, the listed rounds read on from where this read got.
            self._last_end.update(read_to)
            return None
        self._last_end.update(ends)
        return {tp: (self._starts[tp], max(ends[tp], self._starts[tp])) for tp in tps}

    def _listed_bounds(self, tps: list[tuple[str, int]]) -> Bounds:
        began = time.monotonic()
        starts = self._list_offsets(tps, OFFSET_BEGINNING)
        committed = self._list_offsets(tps, OFFSET_END)  # the LSO on Kafka, 0 on Tansu
        uncommitted = self._list_offsets(tps, OFFSET_END, committed=False)  # Tansu's bound
        # A broker slow to list (Tansu, with many batches per partition) is as slow to answer a
        # Fetch below the end: a rung gets as long to answer before the next, lower one (down to
        # the log start, a whole partition's read) is tried.
        self._rung_wait_s = max(_RUNG_WAIT_S, 4 * (time.monotonic() - began) / 3)
        self._starts.update(starts)
        self._starts_at = began
        ladders = {tp: candidate_ladder(starts[tp], committed[tp], uncommitted[tp],
                                        self._last_end.get(tp)) for tp in tps}
        # A Fetch response's end offset as the client keeps it is the high watermark, not the
        # LSO: it may stand for the end only where no transaction was seen open (both
        # ListOffsets answers agree: on a real Kafka, where the read_committed one is the LSO;
        # and on Tansu's durable storage, which answers 1 to both).
        told = {tp for tp in tps if committed[tp] == uncommitted[tp]}
        ends: dict[tuple[str, int], int] = {}
        while len(ends) < len(tps):
            pending = {tp: ladders[tp][0] for tp in tps if tp not in ends}
            last = all(len(ladders[tp]) == 1 for tp in pending)
            found, read_to = self._fetch_ends(
                pending, self.timeout_s if last else self._rung_wait_s, final=last, told=told)
            ends.update(found)
            for tp in pending.keys() - ends.keys():
                # A partition that gave records was fetched below its end: it reads on from
                # where it got (its only rung now) rather than from a lower rung, which would
                # read those records again and stop short of the end a second time.
                ladders[tp] = [read_to[tp]] if tp in read_to else ladders[tp][1:] or ladders[tp]
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
                _found(consumer, key, high, ends, paused)

    @staticmethod
    def _ends_reached(consumer: Consumer, reached: dict[tuple[str, int], int],
                      ends: dict[tuple[str, int], int], paused: list[TopicPartition]) -> None:
        """Ends reached by reading: the records of a Fetch response ran up to the watermark it
        told. While a producer writes, the end moves on before the next Fetch, whose answer
        then holds records again: the partition-EOF event (a Fetch answered at the end) may
        never come on a broker slower to answer than the producer's batches are apart (Tansu
        with many batches). A read_committed reader gets no record past the LSO, so a position
        at the watermark is the LSO too."""
        for key, position in reached.items():
            if key in ends:
                continue
            _, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            if position == high:
                _found(consumer, key, position, ends, paused)

    def _fetch_ends(
        self, candidates: dict[tuple[str, int], int], wait_s: float, *, final: bool,
        told: set[tuple[str, int]] | None = None,
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """Fetch each partition from its candidate until the Fetch reports its end (the LSO):
        the ends found, and where the read of the others got (the offset after their last
        record read, a lower bound of the end).

        Partitions with no end within ``wait_s`` are left out (a candidate above the LSO gets
        no answer), unless ``final``: then the silence is an error."""
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
            reached: dict[tuple[str, int], int] = {}  # the offset after the last record read
            try:
                while len(ends) < len(candidates):
                    fail_point("probe.fetch")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        if not final:
                            break
                        # Where the read got is a lower bound of the end, not the end: a lag
                        # measured against it would be too small. The end is unknown.
                        missing = sorted(set(candidates) - set(ends))
                        if last_error is not None:
                            raise translate(last_error, doing, self.bootstrap)
                        raise ServiceUnavailableError(
                            f"the Kafka broker at {self.bootstrap} sent no Fetch answer "
                            f"{'that reached the end ' if reached else ''}for {missing} within "
                            f"{wait_s:g} s: check that it is running (`kappa dev up`) and "
                            "its log, then retry"
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
                        if err is None:  # a record below the end: its Fetch told the end too
                            reached[(msg.topic() or "", msg.partition() or 0)] = \
                                (msg.offset() or 0) + 1
                            continue
                        if err.code() != KafkaError._PARTITION_EOF:
                            if err.code() in _TRANSIENT:
                                last_error = err
                                continue
                            raise translate(err, f"{doing} of {msg.topic()}/{msg.partition()}",
                                            self.bootstrap)
                        key = (msg.topic() or "", msg.partition() or 0)
                        offset = msg.offset()
                        if key in candidates and key not in ends and offset is not None:
                            _found(consumer, key, offset, ends, paused)
                    self._ends_reached(consumer, reached, ends, paused)
            finally:
                if paused:  # a pause outlives the assignment: the next call would hang
                    consumer.resume(paused)
                consumer.unassign()
        return ends, {k: r for k, r in reached.items() if k not in ends}


def _found(consumer: Consumer, key: tuple[str, int], end: int, ends: dict[tuple[str, int], int],
           paused: list[TopicPartition]) -> None:
    """``end`` is the partition's end. It is paused: later Fetches go to the partitions still
    unanswered, and none may move its kept watermark past this end."""
    ends[key] = end
    paused.append(TopicPartition(*key))
    consumer.pause(paused[-1:])


# How long a candidate above the end may stay unanswered before the next lower one is tried,
# at least.
_RUNG_WAIT_S = 0.5
# How long a kept probe trusts the log starts it listed: a start moves only by retention or
# deletion, and a read below it fails as a gap whatever the probe says.
_STARTS_KEPT_S = 10.0
# After this long, Fetch answers of an assignment have come in (polled every 10 ms).
_TOLD_SETTLE_S = 0.3


def candidate_ladder(start: int, committed: int, uncommitted: int, last_end: int | None
                     ) -> list[int]:
    """Where to fetch a partition's end from, highest first; each a lower bound of the end
    unless a transaction is open. The last rung, the log start, always works."""
    rungs = sorted({max(start, committed, uncommitted, last_end or 0),
                    max(start, committed, last_end or 0), max(start, last_end or 0), start},
                   reverse=True)
    if len(rungs) > 1 and rungs[-2] - start > _START_SCAN_LIMIT:
        # Reading a long log from its start to find its end takes longer than any wait, and on
        # Tansu (every Fetch lists the partition's batches) loads the broker until every other
        # probe falls to this rung too. The lowest rung above it waits the whole timeout.
        rungs.pop()
    return rungs


# The longest read from the log start a probe makes to find the end (records).
_START_SCAN_LIMIT = 10_000


def log_bounds(
    bootstrap: Kafka, topics: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> Bounds:
    """{(topic, partition): (log start, log end)} with a throw-away consumer (~0.1 s)."""
    with LogEndProbe(bootstrap, timeout_s=timeout_s) as probe:
        return probe.bounds(topics)

