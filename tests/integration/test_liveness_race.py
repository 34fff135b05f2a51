"""A status that finds an active run's driver gone records the run failed, but only in the state
it judged: a `kappa stop` (or a pause by live first) in between has stopped the driver on
purpose, and the version stays stopped. Shown first with the fail point
status.before_failing_a_dead_driver: the version was recorded failed, "is gone", after its
stop (and bench/budget.py saw a paused catch-up failed by a status polled meanwhile)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import job_file, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_stop_between_a_status_look_and_its_verdict_leaves_the_version_stopped(
        settings, topic: str, tmp_path: Path) -> None:
    from orchestrator.failpoints import release
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 100, seed=7)
    deployed = service.deploy(job_file(tmp_path, "v1", topic)).status
    assert deployed.pid, deployed
    os.killpg(deployed.pid, signal.SIGKILL)  # the driver dies unseen, its run still active
    released = tmp_path / "released"
    released.mkdir()
    env = {**os.environ, **settings.driver_environment(),
           "KAPPA_FAIL_POINTS": "status.before_failing_a_dead_driver=pause",
           "KAPPA_FAIL_POINTS_RELEASE": str(released)}
    err = tmp_path / "status.err"
    with open(err, "wb") as sink:
        looking = subprocess.Popen([str(Path(sys.executable).with_name("kappa")), "status",
                                    "--json"], env=env, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        wait_until(lambda: "paused until" in err.read_text(), 60,
                   "the status to find the driver gone")
        service.stop("pageview_counts", "v1")
        release(released, "status.before_failing_a_dead_driver")
        assert looking.wait(60) == 0, err.read_text()[-2000:]
    finally:
        looking.kill()
        looking.wait()
    status = service.version_status("pageview_counts", "v1")
    assert status.state.value == "stopped", status.reason
    assert status.reason == "stopped by `kappa stop`"
