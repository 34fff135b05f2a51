"""Produce archived records back into one partition of a new topic so that each lands at its
own offset: in order, with their timestamps and headers, and with the commit markers that
reproduce the gaps (see orchestrator.archive_model.restore_plan)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any, cast

from confluent_kafka import KafkaError, Message, Producer

from orchestrator.archive_model.restore_plan import Run
from orchestrator.errors import ServiceUnavailableError
from orchestrator.kafka.admin import kafka_errors, translate
from orchestrator.kafka.endpoint import Kafka
from orchestrator.kafka.offsets import LogEndProbe
from orchestrator.kafka.producer import producer_config

_CREATE_TIME = 1


def _config(bootstrap: Kafka, timeout_s: float) -> dict[str, Any]:
    # Retries must not reorder records: their offsets are the point.
    return {**producer_config(bootstrap, timeout_s), "enable.idempotence": True}


class ExactProducer:
    """Writes runs to ``topic``/``partition``, which must be empty at the first run's offset."""

    def __init__(self, bootstrap: Kafka, topic: str, partition: int, *,
                 timeout_s: float = 60.0) -> None:
        self.bootstrap, self.topic, self.partition = bootstrap, topic, partition
        self.timeout_s = timeout_s
        self.failures: list[KafkaError] = []
        self.where = f"{topic}/{partition}"
        with kafka_errors(f"creating a producer for {self.where}", bootstrap):
            self.plain = Producer({**_config(bootstrap, timeout_s), "on_delivery": self._failed})
        self.transactional: Producer | None = None
        self.probe = LogEndProbe(bootstrap, timeout_s=timeout_s)

    def _failed(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err)

    def write(self, runs: Iterable[Run]) -> int:
        """Produce every run; return the partition's end offset after the last."""
        end = 0
        try:
            with kafka_errors(f"restoring {self.where}", self.bootstrap):
                for run in runs:
                    if run.commit_marker:
                        self._flush()
                        self._in_transaction(run)
                    else:
                        self._send(self.plain, run)
                    end = run.end_offset
                self._flush()
        finally:
            self.probe.close()
        return end

    def _send(self, producer: Producer, run: Run) -> None:
        for n, (_, timestamp_ms, timestamp_type, key, value, headers) in enumerate(run.records):
            while True:
                try:
                    producer.produce(self.topic, value, key, self.partition,
                                     timestamp=timestamp_ms if timestamp_type == _CREATE_TIME
                                     else 0,
                                     headers=cast(Any, headers))
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 10_000 == 9_999:
                producer.poll(0)
        if self.failures:
            self._raise()

    def _flush(self) -> None:
        if self.plain.flush(self.timeout_s):
            raise ServiceUnavailableError(
                f"records for {self.where} were not delivered within {self.timeout_s:g} s: check "
                f"the broker at {self.bootstrap}, then run `kappa dev up` again")
        if self.failures:
            self._raise()

    def _in_transaction(self, run: Run) -> None:
        if self.transactional is None:
            self.transactional = Producer({
                **_config(self.bootstrap, self.timeout_s), "delivery.report.only.error": False,
                "transactional.id": f"kappa-restore-{uuid.uuid4().hex[:12]}"})
            self.transactional.init_transactions(self.timeout_s)
        self.transactional.begin_transaction()
        self._send(self.transactional, run)
        self.transactional.commit_transaction(self.timeout_s)
        # A broker may write the marker after it answers the commit: nothing may go before it.
        deadline = time.monotonic() + self.timeout_s
        while self.probe.bounds([self.topic]).get((self.topic, self.partition),
                                                  (0, 0))[1] < run.end_offset:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"the commit marker of {self.where} at offset {run.end_offset - 1} did not "
                    f"appear within {self.timeout_s:g} s: check the broker, then run `kappa dev "
                    "up` again")
            time.sleep(0.005)

    def _raise(self) -> None:
        raise translate(self.failures[0], f"restoring {self.where} "
                        f"({len(self.failures)} records failed)", self.bootstrap)


__all__ = ["ExactProducer"]
