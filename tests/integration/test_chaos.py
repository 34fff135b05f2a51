"""Chaos during a replay, two rounds, with exact output after every round:
PostgreSQL stopped and restarted in the middle of a batch commit, the broker suspended for 60 s
during catch-up, and the driver SIGKILLed in the middle of a batch commit.

"In the middle of a batch commit" is made certain, not hoped for: the test holds the lock on
the version's run row, which every commit takes first, and acts once the driver waits on it."""

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
from integration.helpers import assert_batches_tile_the_log, dead_letters, output, own_stack
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
BROKER_OUTAGE_S = 60
ROUNDS = 2  # each round does all three; a third found nothing the second had not


@contextmanager
def _commit_held(settings, service, topic: str, seed: int) -> Iterator[psycopg.Connection]:
    """Produce records and hold the run row's lock until the driver's commit of them waits for
    it. The version must be live: a driver still changing state takes the same lock."""
    assert service.version_status(JOB, "v1").state.value == "live"
    conn = psycopg.connect(settings.pg_dsn, autocommit=False)
    try:
        conn.execute(sql.SQL("SELECT 1 FROM {}.runs r JOIN {}.job_versions v ON v.id = "
                             "r.version_id WHERE v.job = %s FOR UPDATE OF r").format(
            sql.Identifier(settings.catalog_schema), sql.Identifier(settings.catalog_schema)),
            (JOB,))
        service.produce_sample(topic, 15_000, seed=seed)

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


def _exact(settings, service, topic: str, what: str) -> None:
    service.wait(JOB, "v1", timeout_s=300)
    ref = compute(settings.kafka_bootstrap, topic)
    assert output(settings, f"{JOB}__v1") == ref.v1, what
    assert dead_letters(settings, f"{JOB}__v1__dead_letters") == ref.invalid_offsets, what
    assert_batches_tile_the_log(settings, JOB, "v1", topic, ref.log_end)


def test_postgres_restarts_broker_pauses_and_kills_mid_commit_keep_the_output_exact(
    tmp_path: Path
) -> None:
    from orchestrator.dev import stack as dev_stack
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch import launcher

    # A stack of its own: this test takes its services away. Its log in memory: the chaos is in
    # the processes, and the durable log's own crashes are test_dev_stack's.
    with own_stack("kappa-chaos-") as stack:
        state, broker = stack.state, stack.broker
        settings = replace(stack.settings, max_batch_records=5_000, chunk_records=2_500)
        service = Orchestrator(settings)
        topic = "pageviews"
        service.produce_sample(topic, 20_000, seed=91)
        service.deploy(job_file(tmp_path, "v1", topic))
        service.wait(JOB, "v1", timeout_s=300)
        for round_ in range(ROUNDS):
            # PostgreSQL stops while a commit is under way, and comes back.
            with _commit_held(settings, service, topic, seed=100 + round_):
                pid = dev_stack.status(state).postgres.pid
                assert pid
                os.kill(pid, signal.SIGINT)  # fast shutdown: open transactions are lost
                wait_until(lambda: not dev_stack.status(state).postgres.running, 30,
                           "PostgreSQL to stop")
            dev_stack.up(state)
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
    query = sql.SQL("SELECT reason FROM {}.runs").format(sql.Identifier(settings.catalog_schema))

    def driver_reports_the_outage() -> bool:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(query).fetchone()
        return bool(row and row[0] and "unreachable service" in row[0])

    wait_until(driver_reports_the_outage, BROKER_OUTAGE_S, "the driver to report the outage")

    def outage_over() -> bool:
        assert service.version_status(JOB, "v1").state.is_active  # retrying, not failed
        return time.monotonic() - began >= BROKER_OUTAGE_S

    wait_until(outage_over, BROKER_OUTAGE_S + 30, "the end of the broker outage", poll_s=1.0)
