"""Transactional producers: the log end is the last stable offset, offsets without a record are
a batch's gaps, and a replay of a transactional stream accounts for every offset.

Tansu does not filter aborted records for read_committed readers (shared/ENVIRONMENT.md): here
they reach readers, ours and the reference's alike. A real Kafka hides them from both."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from conftest import job_file, kappa_cli
from integration.helpers import dead_letters, output, query
from reference import compute

pytestmark = [pytest.mark.integration]
JOB = "pageview_counts"


def test_the_log_end_stops_at_an_open_transaction(settings) -> None:
    from orchestrator.kafka.admin import ensure_topic
    from orchestrator.kafka.offsets import log_bounds
    from orchestrator.kafka.reader import read_range

    bootstrap = settings.kafka_bootstrap
    topic = f"txn_{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, b'{"n": %d}' % i, partition=0)
    producer.commit_transaction(10)  # offsets 0-2, then its marker at 3
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, b'{"open": %d}' % i, partition=0)
    assert producer.flush(10) == 0  # offsets 4-5 are in the log, their transaction open
    assert log_bounds(bootstrap, [topic]) == {(topic, 0): (0, 4)}
    # A range up to the stable end reads without waiting for the transaction; the marker is a
    # gap, not a record.
    read = [r[0] for batch in read_range(bootstrap, topic, 0, 0, 4, "g", timeout_s=5)
            for r in batch]
    assert read == [0, 1, 2]
    producer.commit_transaction(10)  # its marker at 6
    assert log_bounds(bootstrap, [topic]) == {(topic, 0): (0, 7)}
    read = [r[0] for batch in read_range(bootstrap, topic, 0, 4, 7, "g", timeout_s=5)
            for r in batch]
    assert read == [4, 5]


@pytest.mark.spark
def test_a_transactional_stream_replays_exactly_and_every_offset_is_accounted_for(
    service, settings, topic, tmp_path: Path
) -> None:
    from orchestrator.kafka.offsets import log_bounds

    produced = kappa_cli(settings, "produce-sample", "--topic", topic, "--count", "23500",
                         "--transactional", "--seed", "41")
    assert produced.returncode == 0, produced.stderr
    assert "every 5th aborted" in produced.stdout
    service.deploy(job_file(tmp_path, "v1", topic))
    service.wait(JOB, "v1", timeout_s=240)

    ref = compute(settings.kafka_bootstrap, topic)
    bounds = log_bounds(settings.kafka_bootstrap, [topic])
    offsets = sum(end - start for start, end in bounds.values())
    markers = offsets - ref.records  # offsets that hold no record: the transactions' markers
    assert ref.records == 23_500 and markers >= 24  # 24 transactions, each on 1-4 partitions

    assert output(settings, f"{JOB}__v1") == ref.v1
    dead = dead_letters(settings, f"{JOB}__v1__dead_letters")
    assert dead == ref.invalid_offsets
    rows = sum(views for views, _ in ref.v1.values())
    ((gaps, batch_offsets),) = query(
        settings, f"SELECT sum(gap_offsets), sum(records) FROM {settings.catalog_schema}.batches")
    assert (rows, len(dead), gaps) == (ref.records - ref.invalid, ref.invalid, markers)
    assert rows + len(dead) + gaps == batch_offsets == offsets  # a row, a dead letter or a gap
    (status,) = service.status(JOB)
    assert status.lag_records == 0
    assert status.processed_offsets == {topic: {str(p): e for (_, p), (_, e) in bounds.items()}}
