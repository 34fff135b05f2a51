"""Recovery from logs and checkpoints that changed under a version: a topic recreated while
the driver runs, `kappa restart --allow-gap`, and a checkpoint that is gone."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import (
    assert_batches_tile_the_log,
    batches,
    dead_letters,
    output,
    query,
    stop_drivers,
)
from integration.stream_helpers import example
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _recreate(bootstrap: str, topic: str) -> None:
    from orchestrator.kafka.admin import ensure_topic
    from orchestrator.kafka.offsets import log_bounds

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result()

    def recreated() -> bool:
        try:
            ensure_topic(bootstrap, topic, 4)
            return all(end == 0 for _, end in log_bounds(bootstrap, [topic]).values())
        except Exception:
            return False

    wait_until(recreated, 30, f"{topic} to be recreated empty")


def _sum(*tables: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    views: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for table in tables:
        for url, (v, t) in table.items():
            views[url] += v
            total[url] += t
    return {url: (views[url], total[url]) for url in views}


def test_a_topic_recreated_under_a_live_version_fails_it_then_allow_gap_goes_on(
    service, settings, topic, tmp_path: Path
) -> None:
    service.produce_sample(topic, 20_000, seed=51)
    service.deploy(job_file(tmp_path, "v1", topic))
    service.wait(JOB, "v1", timeout_s=240)
    before = compute(settings.kafka_bootstrap, topic)

    _recreate(settings.kafka_bootstrap, topic)
    # Fewer records than v1 had processed, and the first of the same sample: the new log's
    # invalid records stand at offsets where the old log's stood too.
    service.produce_sample(topic, 4_000, seed=51)

    def failed() -> object:
        (lag,) = service.lag(JOB, "v1")
        assert lag.state != "caught_up" or lag.run_state.value != "live", lag
        st = service.version_status(JOB, "v1")
        assert not st.caught_up(), st
        return st if st.state.value == "failed" else None

    st = wait_until(failed, 120, "v1 to fail on the recreated topic", poll_s=0.5)
    assert topic in st.reason and "recreated" in st.reason and "--allow-gap" in st.reason

    refused = kappa_cli(settings, "restart", JOB, "v1")
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1 and topic in refused.stderr

    resumed = kappa_cli(settings, "restart", "--allow-gap", JOB, "v1")
    assert resumed.returncode == 0, resumed.stderr
    service.wait(JOB, "v1", timeout_s=240)
    after = compute(settings.kafka_bootstrap, topic)
    assert output(settings, f"{JOB}__v1") == _sum(before.v1, after.v1)
    # Every invalid record of both logs is a dead letter: none of the new log's is lost to
    # the old log's at the same offset.
    assert after.invalid_offsets and after.invalid_offsets <= before.invalid_offsets
    assert dead_letters(settings, f"{JOB}__v1__dead_letters") == before.invalid_offsets
    assert query(settings, f"SELECT count(*) FROM {settings.data_schema}.{JOB}__v1__dead_letters"
                 ) == [(len(before.invalid_offsets) + len(after.invalid_offsets),)]
    assert service.version_status(JOB, "v1").dead_letters == \
        len(before.invalid_offsets) + len(after.invalid_offsets)
    (gap,) = [e for e in service.events(JOB, "v1") if e["kind"] == "gap"]
    assert sorted(p["partition"] for p in gap["detail"]["partitions"]) == [0, 1, 2, 3]
    assert all(p["recreated"] and p["log_start"] == 0 for p in gap["detail"]["partitions"])


def test_a_lost_checkpoint_resumes_from_the_catalog_and_a_stream_job_is_refused(
    settings, topic, tmp_path: Path
) -> None:
    from orchestrator.service import Orchestrator

    # A URI checkpoint root: the driver reads it through Hadoop's file system.
    settings = replace(settings, max_batch_records=6_000, chunk_records=3_000,
                       checkpoint_root=f"file://{tmp_path}/checkpoints")
    service = Orchestrator(settings)
    profiles = f"profiles_{topic}"
    try:
        service.produce_sample(topic, 30_000, seed=53)
        service.produce_sample(profiles, 2_000, seed=54, kind="profiles", users=100)
        service.deploy(job_file(tmp_path, "v1", topic))
        service.deploy(example(tmp_path, "user_profiles", {"profiles": profiles}))
        service.wait(JOB, "v1", timeout_s=240)
        service.wait("user_profiles", "v1", timeout_s=240)
        first_batches = len(batches(settings, JOB, "v1"))
        assert first_batches >= 5
        for job in (JOB, "user_profiles"):
            assert kappa_cli(settings, "stop", job, "v1").returncode == 0
            shutil.rmtree(tmp_path / "checkpoints" / job / "v1")

        service.produce_sample(topic, 9_000, seed=55)
        assert kappa_cli(settings, "restart", JOB, "v1").returncode == 0
        service.wait(JOB, "v1", timeout_s=240)
        ref = compute(settings.kafka_bootstrap, topic)
        assert output(settings, f"{JOB}__v1") == ref.v1
        assert dead_letters(settings, f"{JOB}__v1__dead_letters") == ref.invalid_offsets
        rows = assert_batches_tile_the_log(settings, JOB, "v1", topic, ref.log_end)
        assert len(rows) > first_batches  # new batches, numbered after the old ones
        assert (tmp_path / "checkpoints" / JOB / "v1" / "kappa.json").is_file()

        refused = kappa_cli(settings, "restart", "user_profiles", "v1")
        assert refused.returncode == 1
        assert len(refused.stderr.strip().splitlines()) == 1
        assert "checkpoint" in refused.stderr and "new VERSION" in refused.stderr
        assert query(settings, f"SELECT r.state FROM {settings.catalog_schema}.runs r JOIN "
                               f"{settings.catalog_schema}.job_versions v ON v.id = "
                               "r.version_id WHERE v.job = 'user_profiles'") == [("stopped",)]
    finally:
        stop_drivers(service)


def test_a_plan_forgotten_past_the_log_end_leaves_nothing_staged(settings, topic: str,
                                                                   tmp_path: Path) -> None:
    """#47, path 4: a batch planned to offset 150 whose log came back from a restore ending at
    100 is forgotten, and Spark plans it again. What its read tasks had staged (a dead letter at
    offset 120, the count of [100, 150)) stood for records that are gone; new records will stand
    at those offsets, and the next batch's commit moves whatever is staged within its offsets
    (read_accounting.move_dead_letters). It must find nothing stale there."""
    from orchestrator.catalog.db import connect
    from orchestrator.service import Orchestrator
    from orchestrator.spark.checkpoint import Checkpoint
    from orchestrator.spark.resume import _forget_a_plan_past_the_log_end

    Orchestrator(settings).archive_status([topic])  # the catalog exists now
    version_id, schema = 987_654, settings.catalog_schema
    offsets = tmp_path / "checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text(f'v1\n{{}}\n{{"{topic}": {{"0": 150}}}}\n')
    with connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".dead_letter_stage (version_id, topic, partition, '
                     '"offset", error) VALUES (%s, %s, 0, 120, %s)',
                     (version_id, topic, "stale: the record at 120 before the crash"))
        conn.execute(f'INSERT INTO "{schema}".read_stage (version_id, topic, partition, '
                     'range_start, range_end, records) VALUES (%s, %s, 0, 100, 150, 49)',
                     (version_id, topic))
        checkpoint = Checkpoint(str(tmp_path / "checkpoint"))
        assert checkpoint.unfinished_plan() == (0, {topic: {"0": 150}})
        _forget_a_plan_past_the_log_end(conn, schema, version_id, checkpoint,
                                        {(topic, 0): (0, 100)})
        assert checkpoint.unfinished_plan() is None
        staged = [conn.execute(f'SELECT count(*) FROM "{schema}".{table} WHERE version_id = %s',
                               (version_id,)).fetchone()[0]
                  for table in ("dead_letter_stage", "read_stage")]
    assert staged == [0, 0]
