"""A driver on another host (seen from a triggerer, or a worker elsewhere) is never judged by
a local PID, nor signalled: its heartbeats tell, and it stops itself."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import psutil

from orchestrator.models import RunRecord
from orchestrator.spark.launch import launcher
from orchestrator.states import RunState


def _run(pid: int, host: str | None) -> RunRecord:
    return RunRecord(version_id=1, state=RunState.LIVE, attempt=1, pid=pid,
                     pid_started=psutil.Process(pid).create_time(), host=host, app_id=None,
                     log_path=None, reason=None, started_at=datetime.now(UTC),
                     heartbeat_at=None, caught_up_at=None)


def test_only_a_local_driver_is_judged_and_signalled_by_pid() -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        elsewhere = _run(sleeper.pid, "worker-on-another-host")
        assert launcher.driver_alive(elsewhere) is None
        launcher.stop_driver(elsewhere)
        assert sleeper.poll() is None  # the same PID here is somebody else's process

        here = _run(sleeper.pid, launcher.this_host())
        assert launcher.driver_alive(here) is True
        launcher.stop_driver(here)
        assert sleeper.wait(10) is not None
        assert launcher.driver_alive(here) is False
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_task_runners_identity_and_connections_stay_out_of_a_drivers_environment(
        monkeypatch) -> None:
    from orchestrator.settings import Settings

    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "manual__1")
    monkeypatch.setenv("AIRFLOW_CONN_KAPPA_POSTGRES", "postgresql://u:secret@h/db")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = launcher.driver_environment(Settings(pg_dsn="postgresql://h/db"))
    assert "AIRFLOW_CTX_DAG_RUN_ID" not in env and "AIRFLOW_CONN_KAPPA_POSTGRES" not in env
    assert env["SOMETHING_ELSE"] == "kept" and env["KAPPA_PG_DSN"] == "postgresql://h/db"
