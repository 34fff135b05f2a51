"""Produce (key, value) records: lz4, batched by linger, optionally at a fixed rate.

A ``None`` value is produced as a null value: a tombstone on a compacted topic.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from orchestrator.errors import KappaError, ServiceUnavailableError
from orchestrator.kafka.admin import base_config, kafka_errors, translate
from orchestrator.kafka.endpoint import Kafka

__all__ = ["TransactionalResult", "produce", "produce_in_transactions"]

_POLL_EVERY = 10_000  # serve delivery reports every so many records


def producer_config(bootstrap: Kafka, timeout_s: float) -> dict[str, Any]:
    return {
        **base_config(bootstrap),
        "compression.type": "lz4",
        # A batch per partition at most every 250 ms: the embedded broker (Tansu) stores each
        # produced batch as an object and lists a partition's objects at every Fetch, so its
        # reads slow down with their number (README: the embedded stack). flush() sends at once.
        "linger.ms": 250,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "acks": "all",
        # Same key -> same partition as the Java client.
        "partitioner": "murmur2_random",
        # A record that cannot be delivered in time fails instead of waiting 5 minutes.
        "message.timeout.ms": max(1000, int(timeout_s * 1000)),
        # Delivery reports only for failures: no Python callback per record.
        "delivery.report.only.error": True,
    }


class _Bucket:
    """Token bucket: ``rate`` tokens per second, at most ``burst`` saved up."""

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise KappaError(f"rate must be a positive number of records per second, not {rate}")
        self.rate = rate
        self.burst = max(1.0, rate * 0.05)  # 50 ms worth of records
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def wait_s(self) -> float:
        """Seconds to wait before the next record may go (0 if a token is free now)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            return 0.0
        # Wait for a chunk (1/4 of the burst), not one token: no sleep per record.
        return (min(self.burst, max(1.0, self.burst / 4)) - self.tokens) / self.rate


def produce(
    bootstrap: Kafka,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    rate: float | None = None,
    partition: int | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Send every (key, value) of ``records`` to ``topic``; return how many were sent.

    Keyed records go to murmur2(key) partitions (as the Java client does), unless ``partition``
    is given. A ``None`` value is sent as a null value (a tombstone). ``rate`` caps records per
    second with a token bucket. Waits for every delivery and raises a KappaError on the first
    failed one, ServiceUnavailableError if the broker does not take them within ``timeout_s`` of
    the last record.
    """
    failures: list[KafkaError] = []

    def on_error(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    doing = f"producing to topic {topic!r}"
    with kafka_errors(f"creating a producer for {topic!r}", bootstrap):
        producer = Producer({**producer_config(bootstrap, timeout_s), "on_delivery": on_error})
    bucket = _Bucket(rate) if rate is not None else None
    target = -1 if partition is None else partition
    send = producer.produce
    count = 0
    with kafka_errors(doing, bootstrap):
        for key, value in records:
            if bucket is not None:
                if bucket.tokens < 1.0:
                    pause = bucket.wait_s()
                    while pause > 0:
                        producer.poll(pause)  # serves delivery reports while it waits
                        pause = bucket.wait_s()
                bucket.tokens -= 1.0
            while True:
                try:
                    send(topic, value, key, target)
                    break
                except BufferError:  # local queue full: let librdkafka send some
                    producer.poll(0.05)
            count += 1
            if count % _POLL_EVERY == 0:
                producer.poll(0)
                if failures:
                    break
        left = producer.flush(timeout_s) if not failures else producer.flush(1.0)
    if failures:
        raise translate(failures[0], f"{doing} ({len(failures)} records failed)", bootstrap)
    if left:
        raise ServiceUnavailableError(
            f"{left} of {count} records to topic {topic!r} were not delivered to the Kafka broker "
            f"at {bootstrap} within {timeout_s:g} s: check that it runs (`kappa dev up`), then "
            "produce again"
        )
    return count


@dataclass(frozen=True)
class TransactionalResult:
    committed: int  # records in committed transactions
    aborted: int  # records written, then aborted: they hold offsets no reader should count
    transactions: int
    aborted_transactions: int


def produce_in_transactions(
    bootstrap: Kafka,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    per_transaction: int = 1_000,
    abort_every: int = 5,
    timeout_s: float = 60.0,
) -> TransactionalResult:
    """Send ``records`` in transactions of ``per_transaction`` records, aborting every
    ``abort_every``-th one (the 5th, the 10th, ...) after its records reached the broker, as a
    transactional producer that fails does. Each transaction leaves a marker offset per partition
    it wrote to; an aborted one also leaves its records, which read_committed readers skip."""
    if per_transaction < 1 or abort_every < 1:
        raise KappaError("per_transaction and abort_every must be at least 1: fix the call")
    doing = f"producing transactions to topic {topic!r}"
    config = {**producer_config(bootstrap, timeout_s), "delivery.report.only.error": False,
              "transactional.id": f"kappa-sample-{uuid.uuid4().hex[:12]}"}
    with kafka_errors(f"creating a transactional producer for {topic!r}", bootstrap):
        producer = Producer(config)
        producer.init_transactions(timeout_s)
    committed = aborted = transactions = aborted_transactions = 0
    source = iter(records)
    with kafka_errors(doing, bootstrap):
        while chunk := list(islice(source, per_transaction)):
            transactions += 1
            producer.begin_transaction()
            for key, value in chunk:
                while True:
                    try:
                        producer.produce(topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.05)
            if transactions % abort_every == 0:
                if producer.flush(timeout_s):  # the records must be in the log to be aborted
                    raise ServiceUnavailableError(
                        f"records of a transaction to {topic!r} were not delivered within "
                        f"{timeout_s:g} s: check the broker at {bootstrap}, then produce again")
                producer.abort_transaction(timeout_s)
                aborted += len(chunk)
                aborted_transactions += 1
            else:
                producer.commit_transaction(timeout_s)
                committed += len(chunk)
    return TransactionalResult(committed, aborted, transactions, aborted_transactions)
