"""Chaos during a replay, two rounds, with exact output after every round:
PostgreSQL stopped and restarted in the middle of a batch commit, the broker suspended for 60 s
during catch-up, and the driver SIGKILLed in the middle of a batch commit.

"In the middle of a batch commit" is made certain, not hoped for: the test holds the lock on
the version's run row, which every commit takes first, and acts once the driver waits on it.

First, PostgreSQL restarts in the middle of a batch phase's tile commit (#60): a second
version's catch-up over decoded segments, held at its second tile by a fail point until the
test holds the run row, rides the outage out in the same driver and runs the tile's recorded
plan again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import job_file, wait_until
from integration.helpers import (
    assert_batches_tile_the_log,
    assert_exact,
    dead_letters,
    live_lag,
    output,
    own_stack,
    query,
)
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
BROKER_OUTAGE_S = 60
ROUNDS = 2  # each round does all three; a third found nothing the second had not


@contextmanager
def _run_row_held(settings, version: str, then=lambda: None) -> Iterator[psycopg.Connection]:
    """Hold the lock on ``version``'s run row, do ``then``, and wait until its driver's commit
    waits on the lock. The driver must be past its state changes, which take the same lock."""
    conn = psycopg.connect(settings.pg_dsn, autocommit=False)
    try:
        conn.execute(sql.SQL("SELECT 1 FROM {}.runs r JOIN {}.job_versions v ON v.id = "
                             "r.version_id WHERE v.job = %s AND v.version = %s FOR UPDATE OF r"
                             ).format(sql.Identifier(settings.catalog_schema),
                                      sql.Identifier(settings.catalog_schema)), (JOB, version))
        then()

        def driver_waits() -> bool:
            with psycopg.connect(settings.pg_dsn, autocommit=True) as probe:
                row = probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'SELECT attempt FROM%%FOR UPDATE'").fetchone()
            return bool(row and row[0])

        wait_until(driver_waits, 120, "the driver's commit to wait on the run row")
        yield conn
    finally:
        with suppress(psycopg.Error):  # PostgreSQL may have been stopped under it
            conn.rollback()
        conn.close()


def _commit_held(settings, service, topic: str, seed: int):
    """Produce records and hold v1's run row until the driver's commit of them waits on it.
    v1 must be live: a driver still changing state takes the same lock."""
    assert service.version_status(JOB, "v1").state.value == "live"
    return _run_row_held(settings, "v1",
                         lambda: service.produce_sample(topic, 15_000, seed=seed))


def _restart_postgres(state: Path) -> None:
    """Stop PostgreSQL fast (open transactions are lost) and start it again."""
    from orchestrator.dev import stack as dev_stack

    pid = dev_stack.status(state).postgres.pid
    assert pid
    os.kill(pid, signal.SIGINT)
    wait_until(lambda: not dev_stack.status(state).postgres.running, 30, "PostgreSQL to stop")
    dev_stack.up(state)


def _postgres_restarts_mid_tile_commit(settings, service, state: Path, topic: str,
                                       tmp_path: Path, monkeypatch) -> None:
    """v2's catch-up over decoded segments (20,000 records, tiles of 5,000): PostgreSQL stops
    while the second tile's commit waits on the run row; the same driver goes on, and v2 ends
    exact, every tile read from decoded segments."""
    from orchestrator import failpoints

    release = tmp_path / "release"
    release.mkdir()
    # Live first holds the queue while the archiver copies and decodes the log for v2.
    assert service.replays.protect_live([live_lag(JOB, settings.live_lag_limit_s)], 60.0)
    queued = service.deploy(job_file(tmp_path, "v2", topic)).status
    assert queued.state.value == "queued", queued
    service.archive([topic], once=True)
    assert all(p.decoded_segments == p.raw_segments > 0 for p in service.archive_decodings())
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.staged=1*off->1*pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(release))
    assert not service.replays.protect_live([live_lag(JOB, 0.0)], 1.0)
    assert service.replays.schedule() == [(JOB, "v2")]
    monkeypatch.delenv("KAPPA_FAIL_POINTS")
    monkeypatch.delenv("KAPPA_FAIL_POINTS_RELEASE")
    log_path = Path(service.version_status(JOB, "v2").log_path or "")
    wait_until(lambda: "fail point batch.staged: paused" in log_path.read_text(
        errors="replace"), 300, "v2 to hold its second tile, staged")
    with _run_row_held(settings, "v2", lambda: failpoints.release(release, "batch.staged")):
        _restart_postgres(state)
    service.wait(JOB, "v2", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    assert_exact(settings, JOB, "v2", topic, ref, ref.v2)
    st = service.version_status(JOB, "v2")
    assert st.attempt == 1, st  # the outage was ridden out, not crashed on
    tiles = query(settings, f"SELECT b.records, b.decoded_offsets FROM "
                  f"{settings.catalog_schema}.batches b JOIN {settings.catalog_schema}."
                  "job_versions v ON v.id = b.version_id WHERE v.job = %s AND v.version = 'v2' "
                  "AND b.records > 0 ORDER BY b.batch_id", JOB)
    assert tiles == [(5_000, 5_000)] * 4, tiles
    text = log_path.read_text(errors="replace")
    assert "(the batch phase)" in text and "running its recorded plan again" in text
    service.stop(JOB, "v2")
    # v1's read workers keep connections that the restart ended: its next batch finds that
    # out and is retried, before a round holds v1's run row (a retry notes its reason there).
    service.produce_sample(topic, 1_000, seed=92)
    _exact(settings, service, topic, "v1 after the restart mid-tile")


def _exact(settings, service, topic: str, what: str) -> None:
    service.wait(JOB, "v1", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    assert output(settings, f"{JOB}__v1") == ref.v1, what
    assert dead_letters(settings, f"{JOB}__v1__dead_letters") == ref.invalid_offsets, what
    assert_batches_tile_the_log(settings, JOB, "v1", topic, ref.log_end)


def test_postgres_restarts_broker_pauses_and_kills_mid_commit_keep_the_output_exact(
    tmp_path: Path, monkeypatch
) -> None:
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch import launcher

    # A stack of its own: this test takes its services away. Its log in memory: the chaos is in
    # the processes, and the durable log's own crashes are test_dev_stack's.
    with own_stack("kappa-chaos-") as stack:
        state, broker = stack.state, stack.broker
        settings = replace(stack.settings, max_batch_records=5_000, chunk_records=2_500,
                           archive_segment_records=5_000, decoded_batch_records=5_000,
                           live_lag_protect_s=60.0)
        service = Orchestrator(settings)
        topic = "pageviews"
        service.produce_sample(topic, 20_000, seed=91)
        service.deploy(job_file(tmp_path, "v1", topic))
        service.wait(JOB, "v1", timeout_s=300)
        _postgres_restarts_mid_tile_commit(settings, service, state, topic, tmp_path,
                                           monkeypatch)
        for round_ in range(ROUNDS):
            # PostgreSQL stops while a commit is under way, and comes back.
            with _commit_held(settings, service, topic, seed=100 + round_):
                _restart_postgres(state)
            _exact(settings, service, topic, f"round {round_}: PostgreSQL restarted mid-commit")

            # The broker stops answering for a minute while the version catches up (in the
            # first round: a second minute-long outage found nothing the first had not).
            service.produce_sample(topic, 15_000, seed=200 + round_)
            if round_ == 0:
                broker.suspend()
                try:
                    _ride_out_broker_outage(settings, service)
                finally:
                    broker.resume()
                _goes_on(service)
            _exact(settings, service, topic, f"round {round_}: more records"
                   + (", broker suspended" if round_ == 0 else ""))

            # The driver is killed in the middle of a commit; a restart goes on.
            with _commit_held(settings, service, topic, seed=300 + round_):
                driver = service.version_status(JOB, "v1").pid
                assert driver
                os.killpg(driver, signal.SIGKILL)
                wait_until(lambda pid=driver: not launcher.is_alive(pid, None), 30,
                           "the driver to die")
            wait_until(lambda: service.version_status(JOB, "v1").state.value == "failed", 30,
                       "the dead driver to be noticed")
            service.restart(JOB, "v1")
            _exact(settings, service, topic, f"round {round_}: driver killed mid-commit")


def _goes_on(service) -> None:
    """Wait for the driver to make progress again after the broker's outage, or to be caught
    up. It may be sleeping out a retry's backoff (up to 30 s, spark/retries.py) when the broker
    comes back, and then restarts its query: on a loaded machine that took over 30 s, and the
    stall check of `wait` (no progress for 30 s) failed the test (CI, four workers)."""
    def done(st) -> int:
        return sum(o for ps in st.processed_offsets.values() for o in ps.values())

    at_resume = done(service.version_status(JOB, "v1"))
    wait_until(lambda: (st := service.version_status(JOB, "v1")).lag_records == 0
               or done(st) > at_resume, 300, "the driver to go on after the broker's outage")


def _ride_out_broker_outage(settings, service) -> None:
    """Keep the broker away for BROKER_OUTAGE_S, checking each second that the driver says why
    it makes no progress and never gives up."""
    began = time.monotonic()
    reason = sql.SQL("SELECT r.reason FROM {}.runs r JOIN {}.job_versions v ON v.id = "
                     "r.version_id WHERE v.job = %s AND v.version = 'v1'").format(
        sql.Identifier(settings.catalog_schema), sql.Identifier(settings.catalog_schema))

    def driver_reports_the_outage() -> bool:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(reason, (JOB,)).fetchone()
        return bool(row and row[0] and "unreachable service" in row[0])

    wait_until(driver_reports_the_outage, BROKER_OUTAGE_S, "the driver to report the outage")

    def outage_over() -> bool:
        assert service.version_status(JOB, "v1").state.is_active  # retrying, not failed
        return time.monotonic() - began >= BROKER_OUTAGE_S

    wait_until(outage_over, BROKER_OUTAGE_S + 30, "the end of the broker outage", poll_s=1.0)
