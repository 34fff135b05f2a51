"""Replays on local Spark against the embedded PostgreSQL and the Tansu broker."""

from __future__ import annotations

import os
import random
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import (
    assert_batches_tile_the_log,
    dead_letters,
    live_lag,
    output,
    query,
    stop_drivers,
    test_seed,
)
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _matches(settings, version, ref_table) -> bool:
    return output(settings, f"{JOB}__{version}") == ref_table


def test_v1_and_v2_replay_exactly_side_by_side_then_go_live(service, settings, topic,
                                                              tmp_path: Path) -> None:
    # 20,000 records: one batch each, as 100,000 were (max_batch_records 500,000).
    service.produce_sample(topic, 20_000, seed=11)
    service.deploy(job_file(tmp_path, "v1", topic))
    service.wait(JOB, "v1", timeout_s=300)
    v1_batches = len(assert_batches_tile_the_log(
        settings, JOB, "v1", topic, compute(settings.kafka_bootstrap, topic).log_end))

    # v2 replays from offset 0 while v1, live, keeps consuming what is produced meanwhile.
    service.deploy(job_file(tmp_path, "v2", topic))
    service.produce_sample(topic, 20_000, seed=12, rate=20_000)
    service.wait(JOB, "v2", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    assert ref.records == 40_000 and ref.invalid > 0
    wait_until(lambda: _matches(settings, "v1", ref.v1), 300, "v1 to process the new events")
    assert _matches(settings, "v2", ref.v2)

    for version in ("v1", "v2"):
        table = f"{JOB}__{version}"
        dead = dead_letters(settings, f"{table}__dead_letters")
        assert dead == ref.invalid_offsets  # every invalid event, and only those
        views = sum(v for v, _ in output(settings, table).values())
        assert views + len(dead) == ref.records  # every offset accounted for
        assert_batches_tile_the_log(settings, JOB, version, topic, ref.log_end)

    # Side by side without touching each other's tables, checkpoints or consumer groups.
    assert len(assert_batches_tile_the_log(settings, JOB, "v1", topic, ref.log_end)) > v1_batches
    rows = query(settings, f"SELECT version, output_table, checkpoint_dir, consumer_group "
                           f"FROM {settings.catalog_schema}.job_versions ORDER BY version")
    assert len({r[1] for r in rows}) == len({r[2] for r in rows}) == len({r[3] for r in rows}) == 2
    assert all(Path(r[2]).is_dir() for r in rows)
    assert ref.v1 != ref.v2  # the versions really compute different things

    statuses = {st.version: st for st in service.status(JOB)}
    assert {st.state.value for st in statuses.values()} == {"live"}
    for st in statuses.values():
        assert st.lag_records == 0 and st.pid and st.heartbeat_age_s is not None
        assert st.processed_offsets == {topic: {str(p): e for p, e in ref.log_end.items()}}

    # Events produced after catch-up reach both outputs, which the live versions keep exact
    # (the timeout only bounds a hang: a loaded machine may take long).
    service.produce_sample(topic, 2_000, seed=13)
    ref = compute(settings.kafka_bootstrap, topic)
    wait_until(lambda: _matches(settings, "v1", ref.v1) and _matches(settings, "v2", ref.v2),
               300, "live events in both outputs")
    statuses = {st.version: st for st in service.status(JOB)}
    assert {version: st.state.value for version, st in statuses.items()} == {
        "v1": "live", "v2": "live"}


def test_sigkill_at_three_random_moments_of_a_decoded_catch_up_while_a_producer_writes(
        settings, topic, tmp_path: Path) -> None:
    """The catch-up starts as a batch phase (#60): tiles over decoded segments for the first
    half of the log, then tiles read from Kafka for the half the archive lacks, then the
    streaming query for what a producer writes meanwhile. The driver is SIGKILLed at three
    random moments of it (KAPPA_TEST_SEED replays them), and restarts go on from the catalog."""
    from orchestrator.service import Orchestrator

    # Tiles of 4,000 records, so that the catch-up spans 20 of them and a kill lands mid-way.
    settings = replace(settings, decoded_batch_records=4_000, max_batch_records=4_000,
                       chunk_records=2_000, archive_segment_records=5_000,
                       live_lag_protect_s=60.0)
    service = Orchestrator(settings)
    rng = random.Random(test_seed("kill moments"))
    decoded, total = 40_000, 80_000
    service.produce_sample(topic, decoded, seed=21)
    path = job_file(tmp_path, "v2", topic)
    producing = threading.Event()
    producer = threading.Thread(target=_produce_until, args=(service, topic, producing))
    try:
        # Live first holds the queue, so v2 waits in it while the archiver copies the first
        # half and decodes it for v2's decoding.
        assert service.replays.protect_live([live_lag(JOB, settings.live_lag_limit_s)], 60.0)
        result = kappa_cli(settings, "deploy", str(path))
        assert result.returncode == 0, result.stderr
        service.archive([topic], once=True)
        assert [p.decoded_segments for p in service.archive_decodings() if p.topic == topic]
        service.produce_sample(topic, total - decoded, seed=22)
        producing.set()
        producer.start()
        assert not service.replays.protect_live([live_lag(JOB, 0.0)], 1.0)
        assert service.replays.schedule() == [(JOB, "v2")]
        for kill, (low, high) in enumerate(((0.05, 0.25), (0.35, 0.55), (0.65, 0.85))):
            target = int(total * rng.uniform(low, high))

            def progressed(target: int = target) -> object:
                st = service.version_status(JOB, "v2")
                done = sum(o for ps in st.processed_offsets.values() for o in ps.values())
                return st if st.pid and done >= target else None

            st = wait_until(progressed, 240, f"the replay to pass offset {target}", poll_s=0.25)
            os.kill(st.pid, signal.SIGKILL)
            failed = wait_until(
                lambda: (s := service.version_status(JOB, "v2")).state.value == "failed" and s,
                120, "status to report the dead driver")
            # The status says why, with the end of the driver's log, and no PID.
            assert "is gone" in failed.reason and failed.log_tail and failed.pid is None
            if kill == 0:  # `kappa restart` once, the others in process: the same call
                restarted = kappa_cli(settings, "restart", JOB, "v2")
                assert restarted.returncode == 0, restarted.stderr
            else:
                service.restart(JOB, "v2")
        producing.clear()
        producer.join()
        service.wait(JOB, "v2", timeout_s=300)
        ref = compute(settings.kafka_bootstrap, topic)
        assert ref.records > total  # the producer wrote during the kills
        wait_until(lambda: service.version_status(JOB, "v2").lag_records == 0, 300,
                   "v2 to read what the producer wrote")
        final = service.version_status(JOB, "v2")
        # Resumed, the status forgets the failure.
        assert final.attempt == 4 and final.reason is None and not final.log_tail
        assert output(settings, f"{JOB}__v2") == ref.v2
        assert dead_letters(settings, f"{JOB}__v2__dead_letters") == ref.invalid_offsets
        rows = assert_batches_tile_the_log(settings, JOB, "v2", topic, ref.log_end)
        assert len({r[1] for r in rows}) >= 2  # batches from several attempts
        # Each batch within the decoded segments' range read all its offsets from them.
        schema = settings.catalog_schema
        ends = dict(query(settings, f"SELECT partition::text, max(end_offset) FROM "
                          f"{schema}.archive_decoded WHERE topic = %s GROUP BY 1", topic))
        within = [(n, d) for n, d, end in query(
            settings, f"SELECT b.records, b.decoded_offsets, b.end_offsets FROM {schema}.batches "
            f"b JOIN {schema}.job_versions v ON v.id = b.version_id WHERE v.job = %s", JOB)
            if all(o <= ends.get(p, -1) for p, o in end[topic].items())]
        assert all(n == d for n, d in within), within
        assert sum(n for n, _ in within) >= decoded * 0.75, (within, ends)
        text = Path(final.log_path or "").read_text(errors="replace")
        first = text.split("=== attempt 2 starting", 1)[0]
        assert "(the batch phase)" in first and "batch phase:" not in first  # killed in it
        events = [e["kind"] for e in service.events(JOB, "v2")]
        assert events.count("state") >= 12
    finally:
        producing.clear()
        if producer.is_alive():
            producer.join()
        stop_drivers(service)


def _produce_until(service, topic: str, producing: threading.Event) -> None:
    """Write 250 records a second, 100 at a time, while ``producing`` is set."""
    seed = 1_000
    while producing.is_set():
        service.produce_sample(topic, 100, seed=seed, rate=250)
        seed += 1
