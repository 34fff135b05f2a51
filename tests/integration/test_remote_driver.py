"""Seen from another host (an Airflow triggerer, a worker elsewhere), a driver is judged by its
heartbeats, never by a local PID, and a stop reaches it through the catalog."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg import sql

from conftest import job_file, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def test_a_driver_on_another_host_is_not_failed_and_stops_itself(settings, topic,
                                                                 tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch import launcher

    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=197)
    service.deploy(job_file(tmp_path, "v1", topic))
    st = wait_until(lambda: (s := service.version_status(JOB, "v1")).heartbeat_age_s is not None
                    and s, 180, "the driver's first heartbeat")
    pid = st.pid  # type: ignore[union-attr]
    started = psutil.Process(pid).create_time()
    try:
        # As another host sees it: the run is elsewhere, and its PID here is not its process.
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {}.runs SET host = 'worker-elsewhere', pid_started = 1")
                         .format(sql.Identifier(settings.catalog_schema)))
        assert service.version_status(JOB, "v1").state.is_active
        (lag,) = service.lag(JOB, "v1")
        assert lag.state != "stopped"  # its heartbeats are fresh
        stopped = service.stop(JOB, "v1")  # cannot signal it from "here"
        assert stopped.state.value == "stopped"
        wait_until(lambda: not launcher.is_alive(pid, started), 180,
                   "the driver to stop itself at its next heartbeat")
    finally:
        launcher.terminate(pid, started)


@pytest.mark.airflow
def test_a_silent_remote_driver_fails_the_sensor_within_the_heartbeat_timeout(
        settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import os
    import signal
    import time
    from dataclasses import replace

    from orchestrator.airflow.hooks import public_settings
    from orchestrator.airflow.triggers import KappaCaughtUpTrigger
    from orchestrator.errors import StateError
    from orchestrator.service import Orchestrator

    from integration.airflow_env import airflow_env

    settings = replace(settings, heartbeat_timeout_s=6.0)
    for name, value in airflow_env(settings, tmp_path / "airflow", tmp_path).items():
        if name.startswith(("AIRFLOW", "KAPPA_")):
            monkeypatch.setenv(name, value)
    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=198)
    service.deploy(job_file(tmp_path, "v1", topic))
    st = wait_until(lambda: (s := service.version_status(JOB, "v1")).heartbeat_age_s is not None
                    and s, 180, "the driver's first heartbeat")
    # The driver runs on "another host", and dies there: only its heartbeats stop.
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {}.runs SET host = 'worker-elsewhere'")
                     .format(sql.Identifier(settings.catalog_schema)))
    os.kill(st.pid, signal.SIGKILL)  # type: ignore[union-attr, arg-type]
    killed = time.time()
    # "Within the heartbeat timeout" is judged poll by poll, not by the clock (a loaded machine
    # made the polls themselves slow): no poll that began after the heartbeat had been silent
    # longer than the timeout may come back with a status instead of the failure.
    polls: list[tuple[float, str]] = []  # (the heartbeat's age as a poll began, its answer)
    progress = Orchestrator.catch_up_progress

    def watched(self: Orchestrator, job: str, version: str, **kwargs: Any) -> Any:
        silent = _silent_s(settings)
        try:
            status = progress(self, job, version, **kwargs)
        except Exception as exc:
            polls.append((silent, type(exc).__name__))
            raise
        polls.append((silent, status.state.value))
        return status

    monkeypatch.setattr(Orchestrator, "catch_up_progress", watched)
    trigger = KappaCaughtUpTrigger(
        job=JOB, version="v1", max_lag=0, poll_interval=1.0,
        postgres_conn_id="kappa_postgres", kafka_conn_id="kappa_kafka",
        project_dir=str(tmp_path), settings=public_settings(settings),
        # Only bounds a hang: a sensor that never judges the heartbeats reports this timeout.
        deadline=killed + 300)

    async def first_event() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    payload = asyncio.run(asyncio.wait_for(first_event(), 360))
    assert payload["status"] == "error", payload
    assert "worker-elsewhere has not beaten" in payload["message"]
    assert polls and polls[-1][1] == "StateError", polls
    late = [(silent, said) for silent, said in polls[:-1]
            if silent > settings.heartbeat_timeout_s and said != "ServiceUnavailableError"]
    assert not late, f"polls after the heartbeat timeout did not fail the sensor: {polls}"
    assert service.version_status(JOB, "v1").state.value == "failed"
    with pytest.raises(StateError, match="it is failed"):
        service.promote(JOB, "v1")


def _silent_s(settings: Any) -> float:
    """How long the run's driver has not beaten, measured as the status measures it."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT coalesce(heartbeat_at, started_at) FROM {}.runs")
                           .format(sql.Identifier(settings.catalog_schema))).fetchone()
    assert row is not None and row[0] is not None
    return (datetime.now(UTC) - row[0]).total_seconds()
