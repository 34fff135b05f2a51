"""The ack proxy syncs an acknowledged end to its ledger before the producer hears of it (#47).

The restore names as LOST every offset the ledger holds past the archive's end, so a producer
that heard of a record the ledger does not hold could lose it unreported. The proxy is killed
(fail point ``ack_proxy.before_forward``, an exit with no clean-up) between the sync of one
Produce's ends and its forward: the ledger must then hold every end the producer heard of, and
the one it never heard, and nothing the broker did not append."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration]
HEARD_BEFORE_THE_KILL = 5


def _produce_one_at_a_time(bootstrap: str, topic: str) -> tuple[list[int], list[str]]:
    """Offsets the producer heard acknowledged, and the errors it was told, until the first."""
    from confluent_kafka import KafkaError, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": False, "retries": 0, "linger.ms": 0,
                         "max.in.flight.requests.per.connection": 1,
                         "message.timeout.ms": 10_000, "reconnect.backoff.max.ms": 500})
    heard: list[int] = []
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            heard.append(msg.offset())
        else:
            errors.append(str(err))

    for n in range(HEARD_BEFORE_THE_KILL * 4):
        producer.produce(topic, key=b"k", value=f"r{n}".encode(), partition=0,
                         on_delivery=delivered)
        producer.flush(30)
        if errors:
            break
    return heard, errors


def test_the_proxy_killed_between_its_sync_and_the_forward_has_noted_what_it_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from orchestrator.dev.ack_ledger import read_ledger
    from orchestrator.dev.broker_process import start_broker
    from orchestrator.dev.processes import live_process
    from orchestrator.dev.proxy_process import ledger_path, start_proxy
    from orchestrator.failpoints import EXIT_STATUS

    # A broker of its own, in memory, behind its proxy as `kappa dev up` starts them: the
    # broker advertises the proxy's port, so every client request goes through the proxy.
    monkeypatch.setenv("KAPPA_FAIL_POINTS",
                       f"ack_proxy.before_forward={HEARD_BEFORE_THE_KILL}*off->exit")
    started = start_broker(tmp_path, None, None, archived=True)
    monkeypatch.delenv("KAPPA_FAIL_POINTS")
    broker = psutil.Process(started["broker_pid"])
    proxy = live_process(started, "proxy")
    assert proxy is not None
    try:
        bootstrap, port = started["kafka_bootstrap"], started["broker_port"]
        direct = started["broker_listen_port"]
        topic = f"acked_{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
        heard, errors = _produce_one_at_a_time(bootstrap, topic)
        assert proxy.wait(30) == EXIT_STATUS, (tmp_path / "ack-proxy.log").read_text()
        assert heard == list(range(HEARD_BEFORE_THE_KILL)) and errors, (heard, errors)

        noted = read_ledger(ledger_path(tmp_path)).get(topic, {}).get(0)

        # The broker advertises the proxy's port: a proxy without the fail point takes it.
        proxy = live_process(start_proxy(tmp_path, port, direct), "proxy")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
        try:
            _, appended = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        finally:
            consumer.close()
    finally:
        for process in (proxy, broker):
            with contextlib.suppress(psutil.Error):
                if process is not None:
                    process.kill()
                    process.wait(30)
    # Every end the producer heard of, and the one whose forward the kill cut off: it was
    # synced first. Nothing past what the broker appended.
    assert noted == HEARD_BEFORE_THE_KILL + 1 == appended, (noted, heard, appended)
