"""Exact offset-range reads: every record with start <= offset < end, once, in offset order.

The hot path of a replay. Records are plain tuples ``(offset, timestamp_ms, key, value)``.

Broker facts this relies on (see shared/ENVIRONMENT.md): Tansu ignores per-partition fetch size
limits, so a reader stops at ``end - 1`` itself and caps ``fetch.max.bytes``; offsets without a
record (transaction markers, compaction) are passed by watching the partition-EOF event and the
offsets of later records, so a range whose last offsets hold no record does not hang.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_left
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from orchestrator.errors import KappaError, LogGapError, ServiceUnavailableError
from orchestrator.kafka.admin import base_config, kafka_errors, translate
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import log_bounds

__all__ = ["Record", "RecordWithHeaders", "read_all", "read_range"]

# (offset, timestamp in ms since the epoch, key, value)
Record = tuple[int, int, bytes | None, bytes | None]
# The same with the record's headers last: [(name, value)] or None when it has none.
RecordWithHeaders = tuple[int, int, bytes | None, bytes | None,
                          list[tuple[str, bytes | None]] | None]

_OFFSET = itemgetter(0)
_EOF = KafkaError._PARTITION_EOF
_OUT_OF_RANGE = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})
_TRANSIENT = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError._RESOLVE, KafkaError._TIMED_OUT})


def _range_config(bootstrap: Kafka, group_id: str, records: int) -> dict[str, Any]:
    """The "many small range readers" tuning measured on Tansu (shared/ENVIRONMENT.md)."""
    return {
        **base_config(bootstrap),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        # Records of aborted transactions are skipped; their offsets, like the transaction
        # markers', are offsets with no record, which the caller counts as gaps.
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",  # a start below the log start is a gap, not "earliest"
        "fetch.max.bytes": 1_048_576,
        "max.partition.fetch.bytes": 1_048_576,
        "queued.min.messages": max(1, min(20_000, records)),
        "fetch.queue.backoff.ms": 5,
        # 0 makes Tansu spin and the consumer hang. Below 100, Tansu's durable storage answers
        # with no records: it gives up reading its store when the wait is over (a 420 k-record
        # read took 26 s at 10 ms, 1.7 s at 100). The memory storage answers at once either way.
        "fetch.wait.max.ms": 100,
        "check.crcs": False,
    }


def read_range(
    bootstrap: Kafka,
    topic: str,
    partition: int,
    start: int,
    end: int,
    group_id: str,
    *,
    batch_size: int = 10_000,
    timeout_s: float = 30.0,
    headers: bool = False,
    timestamp_types: bool = False,
) -> Iterator[list[Record]]:
    """Yield lists of records covering offsets [start, end) of one partition exactly.

    With ``headers`` each record is a :data:`RecordWithHeaders` (typed as Record for callers
    that do not ask for them); with ``timestamp_types`` it is the archive's
    ``(offset, timestamp_ms, timestamp_type, key, value, headers)``.

    Lists hold at most ``batch_size`` records and are never empty. Uses ``group_id`` with
    ``assign()`` (no group join) and commits nothing. Raises LogGapError if ``start`` is below
    the log start, and KappaError if the log does not reach ``end`` (nor makes progress) within
    ``timeout_s``. The consumer is created on the first ``next()`` and closed when the iterator
    ends or is closed.
    """
    if batch_size < 1:
        raise KappaError(f"batch_size must be at least 1, not {batch_size}: fix the call")
    if start < 0 or end <= start:
        return
    where = f"{topic}/{partition} [{start}, {end})"
    doing = f"reading {where}"
    with kafka_errors(f"creating a consumer for {where}", bootstrap):
        consumer = Consumer(_range_config(bootstrap, group_id, end - start))
    try:
        with kafka_errors(doing, bootstrap):
            consumer.assign([TopicPartition(topic, partition, start)])
        consume = consumer.consume
        nxt = start  # every offset below nxt has been yielded or holds no record
        progress_deadline = time.monotonic() + timeout_s
        last_error: KafkaError | None = None
        log_end: int | None = None  # the last partition-EOF offset seen
        while nxt < end:
            with kafka_errors(doing, bootstrap):
                # Ask for no more than the range still holds, so the last call returns as soon
                # as the last record arrives instead of waiting out its timeout.
                msgs = consume(min(batch_size, end - nxt), 0.5)
            if not msgs:
                if time.monotonic() > progress_deadline:
                    if log_end is None:  # no EOF (e.g. start beyond the end on Tansu)
                        _, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), cached=True
                        )
                        log_end = high if high >= 0 else None
                    raise _stalled(
                        bootstrap, where, nxt=nxt, timeout_s=timeout_s, last_error=last_error,
                        log_end=log_end,
                    )
                continue
            if timestamp_types:  # the archive's records: ArchivedRecord
                records = cast(
                    list[Record],
                    [(m.offset(), m.timestamp()[1], m.timestamp()[0], m.key(), m.value(),
                      m.headers()) for m in msgs if m.error() is None],
                )
            elif headers:
                records = cast(
                    list[Record],
                    [(m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
                     for m in msgs if m.error() is None],
                )
            else:
                records = cast(
                    list[Record],
                    [(m.offset(), m.timestamp()[1], m.key(), m.value()) for m in msgs
                     if m.error() is None],
                )
            reached: int | None = None
            if len(records) != len(msgs):
                reached, transient = _handle_errors(consumer, msgs, bootstrap, where, start)
                if transient is not None:
                    last_error = transient
            if records:
                first: int = records[0][0]
                last: int = records[-1][0]
                if first < nxt or last >= end:  # rare: trim to [nxt, end)
                    lo = bisect_left(records, nxt, key=_OFFSET)
                    hi = bisect_left(records, end, key=_OFFSET)
                    records = records[lo:hi]
                nxt = max(nxt, last + 1)
            if reached is not None:
                log_end = reached
            if reached is not None and reached > nxt:
                # Partition EOF at the high watermark: every record below it has been delivered,
                # so offsets up to there without a record (markers, compaction) are passed.
                nxt = reached
            if records:
                progress_deadline = time.monotonic() + timeout_s
                yield records
    finally:
        consumer.close()


def _handle_errors(
    consumer: Consumer, msgs: list[Message], bootstrap: Kafka, where: str, start: int
) -> tuple[int | None, KafkaError | None]:
    """Look at the error events of one consume() call: (EOF offset or None, transient error)."""
    reached: int | None = None
    transient: KafkaError | None = None
    for m in msgs:
        err = m.error()
        if err is None:
            continue
        code = err.code()
        if code == _EOF:
            offset = m.offset()
            if offset is not None:
                reached = offset if reached is None else max(reached, offset)
        elif code in _OUT_OF_RANGE:
            raise _out_of_range(consumer, m, bootstrap, where, start)
        elif code in _TRANSIENT:
            transient = err
        else:
            raise translate(err, f"reading {where}", bootstrap)
    return reached, transient


def _out_of_range(
    consumer: Consumer, m: Message, bootstrap: Kafka, where: str, start: int
) -> KappaError:
    """A gap (start below the log start) or a range beyond the log end: say which."""
    (tp,) = consumer.assignment()  # read_range assigns exactly one partition
    err = m.error()
    detail = "" if err is None else f" ({err.str()})"
    with kafka_errors(f"reading the log start of {where}", bootstrap):
        log_start, _ = consumer.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), timeout=10
        )
    if start < log_start:
        return LogGapError(
            f"offset {start} of {where} is no longer in the log (it starts at {log_start}: "
            "retention removed the rest, or the topic was recreated): deploy with --allow-gap "
            f"to replay what is left{detail}"
        )
    return KappaError(
        f"offset {start} of {where} is beyond the log end{detail}: read only up to the log "
        "end that log_bounds() reports"
    )


def _stalled(
    bootstrap: Kafka,
    where: str,
    *,
    nxt: int,
    timeout_s: float,
    last_error: KafkaError | None,
    log_end: int | None,
) -> KappaError:
    if last_error is not None:
        return translate(last_error, f"reading {where}", bootstrap)
    if log_end is not None and log_end <= nxt:
        return KappaError(
            f"reading {where}: the log ends at offset {log_end} and no record came for "
            f"{timeout_s:g} s: read only up to the log end that log_bounds() reports"
        )
    return ServiceUnavailableError(
        f"reading {where} made no progress at offset {nxt} for {timeout_s:g} s: the log ends "
        f"before the range does, or the broker at {bootstrap} stopped answering; check the "
        "offsets with `kappa status` and the broker log"
    )


def read_all(
    bootstrap: Kafka, topic: str
) -> Iterator[tuple[int, int, int, bytes | None, bytes | None]]:
    """Every record of ``topic`` as (partition, offset, timestamp_ms, key, value).

    Partition by partition, up to the log end found at the call. For tests and references.
    """
    group_id = f"kappa-read-all-{uuid.uuid4().hex[:12]}"
    for (_, partition), (start, end) in sorted(log_bounds(bootstrap, [topic]).items()):
        for batch in read_range(bootstrap, topic, partition, start, end, group_id):
            for offset, ts, key, value in batch:
                yield partition, offset, ts, key, value
