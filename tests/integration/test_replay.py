"""Replays on local Spark against the embedded PostgreSQL and the Tansu broker."""

from __future__ import annotations

import os
import random
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import (
    assert_batches_tile_the_log,
    dead_letters,
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


def test_sigkill_at_three_random_moments_then_restart_is_exact(settings, topic,
                                                                 tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    # Small batches, so that the replay spans many of them and a kill lands mid-replay.
    settings = replace(settings, max_batch_records=6_000, chunk_records=3_000)
    service = Orchestrator(settings)
    rng = random.Random(test_seed("kill moments"))
    total = 120_000  # 20 batches
    service.produce_sample(topic, total, seed=21)
    path = job_file(tmp_path, "v2", topic)
    try:
        result = kappa_cli(settings, "deploy", str(path))
        assert result.returncode == 0, result.stderr
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
        final = service.wait(JOB, "v2", timeout_s=300)
        # Resumed, the status forgets the failure.
        assert final.attempt == 4 and final.reason is None and not final.log_tail
        ref = compute(settings.kafka_bootstrap, topic)
        assert output(settings, f"{JOB}__v2") == ref.v2
        assert dead_letters(settings, f"{JOB}__v2__dead_letters") == ref.invalid_offsets
        rows = assert_batches_tile_the_log(settings, JOB, "v2", topic, ref.log_end)
        assert len({r[1] for r in rows}) >= 2  # batches from several attempts
        events = [e["kind"] for e in service.events(JOB, "v2")]
        assert events.count("state") >= 12
    finally:
        stop_drivers(service)
