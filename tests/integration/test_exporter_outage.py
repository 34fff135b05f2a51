"""The exporter keeps serving through a 30 s broker outage and a 30 s PostgreSQL outage, marks
its data stale meanwhile, and recovers by itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import job_file, wait_until
from integration.helpers import stop_drivers
from integration.observability import agent, scrape

pytestmark = [pytest.mark.integration, pytest.mark.spark]
OUTAGE_S = 30.0


def _stale(target: str) -> float:
    for line in scrape(target).splitlines():
        if line.startswith("kappa_exporter_stale "):
            return float(line.split()[1])
    raise AssertionError("no kappa_exporter_stale in the scrape")


def _serve_through_outage(target: str, what: str) -> None:
    """Every scrape during the outage answers; the data turns stale."""
    began = time.monotonic()
    wait_until(lambda: _stale(target) == 1.0, OUTAGE_S, f"stale data during the {what} outage")

    def served_to_the_end() -> bool:
        assert "kappa_exporter_stale" in scrape(target)  # still serving
        return time.monotonic() - began >= OUTAGE_S

    # A scrape a second, as Prometheus would, until the outage is over.
    wait_until(served_to_the_end, OUTAGE_S + 30, f"the end of the {what} outage", poll_s=1.0)


def test_agent_survives_broker_and_postgres_outages(tmp_path: Path) -> None:
    from orchestrator.dev import stack as dev_stack
    from orchestrator.service import Orchestrator
    from orchestrator.settings import Settings

    # A stack of its own: this test takes its services away.
    state = Path(tempfile.mkdtemp(prefix="kappa-outage-"))
    up = dev_stack.up(state)
    settings = Settings(state_dir=state, pg_dsn=up.pg_dsn, kafka_bootstrap=up.kafka_bootstrap)
    service = Orchestrator(settings)
    try:
        service.produce_sample("pageviews", 2_000, seed=81)
        service.deploy(job_file(tmp_path, "v1", "pageviews"))
        service.wait("pageview_counts", "v1", timeout_s=300)
        with agent(settings, tmp_path, "--interval", "1", "--window", "5",
                   archive=True) as target:
            wait_until(lambda: _stale(target) == 0.0, 30, "fresh metrics")
            assert 'kappa_lag_records{kappa_job="pageview_counts",version="v1"} 0.0' in scrape(
                target)

            broker = psutil.Process(json.loads((state / "dev" / "stack.json").read_text())
                                    ["broker_pid"])
            broker.suspend()  # the broker stops answering
            try:
                _serve_through_outage(target, "broker")
            finally:
                broker.resume()
            wait_until(lambda: _stale(target) == 0.0, 60, "recovery after the broker outage")

            postgres_pid = dev_stack.status(state).postgres.pid
            assert postgres_pid
            os.kill(postgres_pid, signal.SIGINT)  # fast shutdown
            wait_until(lambda: not dev_stack.status(state).postgres.running, 30,
                       "PostgreSQL to stop")
            _serve_through_outage(target, "PostgreSQL")
            dev_stack.up(state)  # brings PostgreSQL back on the same socket
            wait_until(lambda: _stale(target) == 0.0, 60, "recovery after the PostgreSQL outage")
            assert "kappa_lag_records" in scrape(target)
    finally:
        try:
            stop_drivers(service)
        finally:
            dev_stack.down(state)
            shutil.rmtree(state, ignore_errors=True)
