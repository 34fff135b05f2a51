"""Stopping a driver by its recorded PID (#61 path 8): a run keeps its driver's PID and start
time after the driver is gone (a pause by live first, a crash), and a later `kappa stop` sends
SIGKILL to that PID's process group, to take the JVM that outlived its driver. Once the PID is
another process's, the group is that process's: it must be left alone. Real processes, no
services."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from orchestrator.spark.launch.driver_process import is_alive, terminate

# Stand-ins wait for the signal that ends them.
_WAITER = [sys.executable, "-c", "import signal; signal.pause()"]


def _group_leader() -> subprocess.Popen[bytes]:
    """A process leading a process group of its own, as a driver does (and as any other
    program started with setsid does)."""
    return subprocess.Popen(_WAITER, start_new_session=True)


def test_the_group_of_a_pid_that_another_process_now_holds_is_left_alone() -> None:
    other = _group_leader()
    try:
        # The record of a driver that ran long ago under the same PID: another start time.
        recorded_start = psutil.Process(other.pid).create_time() - 3600.0
        assert not is_alive(other.pid, recorded_start)
        terminate(other.pid, recorded_start, grace_s=1.0)
        # A signal sent before ours ends it first: it dies of SIGTERM only if terminate() sent
        # it nothing.
        other.terminate()
        assert other.wait(timeout=30) == -signal.SIGTERM, \
            "terminate() killed the process group of another program"
    finally:
        other.kill()
        other.wait()


def test_what_outlived_a_dead_driver_in_its_group_is_still_killed() -> None:
    # The driver leads the group and starts a child (its JVM), then dies; the child stays.
    driver = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
         "'-c', 'import signal; signal.pause()']); print(p.pid, flush=True)"],
        start_new_session=True, stdout=subprocess.PIPE)
    started = psutil.Process(driver.pid).create_time()
    assert driver.stdout is not None
    with driver.stdout:
        leftover = psutil.Process(int(driver.stdout.readline()))
    driver.wait()
    try:
        assert leftover.is_running() and leftover.status() != psutil.STATUS_ZOMBIE
        terminate(driver.pid, started, grace_s=1.0)
        leftover.wait(timeout=10)  # raises TimeoutExpired if it was left running
    finally:
        if leftover.is_running():
            leftover.kill()
