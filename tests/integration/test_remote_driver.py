"""Seen from another host (an Airflow triggerer, a worker elsewhere), a driver is judged by its
heartbeats, never by a local PID, and a stop reaches it through the catalog."""

from __future__ import annotations

from pathlib import Path

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
    from orchestrator.spark import launcher

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
        wait_until(lambda: not launcher.is_alive(pid, started), 60,
                   "the driver to stop itself at its next heartbeat")
    finally:
        launcher.terminate(pid, started)
