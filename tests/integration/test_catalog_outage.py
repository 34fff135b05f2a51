"""PostgreSQL crashes while a driver works in the catalog outside a batch: while its query
waits to be started again after an outage, and at the end of the catch-up, where the driver
measures its lag and records caught_up. The driver waits each outage out, as it does inside a
batch, instead of failing the version for good with no one left to restart it.

Seen in the stream chaos test under load: the postmaster was SIGKILLed during the catch-up and
the version made no progress for ten minutes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from conftest import job_file, wait_until
from integration.helpers import output, own_stack
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _log(service) -> str:
    path = service.version_status(JOB, "v1").log_path
    return Path(path).read_text(errors="replace") if path and Path(path).exists() else ""


def test_postgres_killed_outside_a_batch_is_waited_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.dev import stack as dev_stack
    from orchestrator.failpoints import release
    from orchestrator.spark.launch import launcher

    def kill_postgres() -> None:
        pid = dev_stack.status(stack.state).postgres.pid
        assert pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not dev_stack.status(stack.state).postgres.running, 30,
                   "PostgreSQL to be gone")

    with own_stack("kappa-pg-outage-") as stack:
        service, topic = stack.service, "pageviews"
        service.produce_sample(topic, 30_000, seed=85)  # the first batch takes 10,000
        # The first batch holds still after its commit, and so does the first measurement of
        # the lag after the catch-up, until the test lets each go on: PostgreSQL dies in each
        # window, however long the kill takes on a loaded machine.
        released = tmp_path / "released"
        released.mkdir()
        monkeypatch.setenv("KAPPA_FAIL_POINTS",
                           "batch.after_pg_commit=1*pause;driver.measure_lag=1*pause")
        monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
        service.deploy(job_file(tmp_path, "v1", topic))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        wait_until(lambda: "fail point batch.after_pg_commit: paused" in _log(service), 240,
                   "the first batch's commit")
        driver = service.version_status(JOB, "v1").pid
        log_path = Path(service.version_status(JOB, "v1").log_path or "")
        # Down until the next batch has failed and the driver has tried to reconnect.
        kill_postgres()
        release(released, "batch.after_pg_commit")
        wait_until(lambda: "cannot reconnect to the catalog yet" in log_path.read_text()
                   or not launcher.is_alive(driver, None), 120,
                   "the driver to try the catalog while PostgreSQL is down")
        assert launcher.is_alive(driver, None), (
            "the driver died while PostgreSQL was down:\n" + log_path.read_text()[-3000:])
        dev_stack.up(stack.state)
        wait_until(lambda: "fail point driver.measure_lag: paused" in _log(service), 240,
                   "the driver to reach the lag measurement")
        kill_postgres()
        dev_stack.up(stack.state)
        release(released, "driver.measure_lag")
        try:
            st = service.wait(JOB, "v1", timeout_s=180)
        except Exception:
            print(_log(service)[-4000:])
            raise
        assert st.state.value == "live" and st.attempt == 1, st  # no restart was needed
        log = _log(service)
        assert "cannot read the processed offsets yet" in log  # waited out, not failed
        assert output(stack.settings, f"{JOB}__v1") == compute(
            stack.settings.kafka_bootstrap, topic).v1
