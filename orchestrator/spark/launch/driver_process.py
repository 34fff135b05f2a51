"""Whether a driver's process still runs, and stopping its whole process group: used by the
launcher and by the warm spares (which must not import the launcher, which adopts them). Also
where each driver start is noted for whoever counts them (the test suite's figures)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

# A file to which each driver start appends a line naming its kind: "cold" (a driver process
# started for a version), "spare" (a warm spare's JVM) or "adopted" (a version handed to a warm
# spare, which starts no JVM). tests/cpu_accounting.py counts them per test.
START_LOG_VARIABLE = "KAPPA_DRIVER_START_LOG"


def note_start(kind: str) -> None:
    path = os.environ.get(START_LOG_VARIABLE)
    if not path:
        return
    with contextlib.suppress(OSError):  # a count, never a reason for a start to fail
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{kind}\n".encode())  # one write with O_APPEND: lines never mix
        finally:
            os.close(fd)


def is_alive(pid: int | None, started: float | None) -> bool:
    if not pid:
        return False
    try:
        process = psutil.Process(pid)
        # Create times are derived from the boot time, which may shift by a fraction of a second
        # between readings; a reused PID within one second is not a realistic risk.
        if started and abs(process.create_time() - started) > 1.0:
            return False
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def terminate(pid: int | None, started: float | None, grace_s: float = 10.0) -> None:
    """Stop a driver's whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
    if not pid or not is_alive(pid, started):
        _kill_group(pid, started, signal.SIGKILL)  # leftovers (the JVM) of a driver that died
        return
    _kill_group(pid, started, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_alive(pid, started):
        time.sleep(0.1)
    _kill_group(pid, started, signal.SIGKILL)
    _reap(pid)


def _kill_group(pid: int | None, started: float | None, sig: signal.Signals) -> None:
    if not pid or _held_by_another(pid, started):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _held_by_another(pid: int, started: float | None) -> bool:
    """Whether the PID is now another process's than the driver started at ``started``: its
    process group is then that process's. While any process is left in the driver's group,
    Linux gives no new process its PID, so a free PID means that the group is the driver's."""
    if started is None:
        return False
    try:
        return bool(abs(psutil.Process(pid).create_time() - started) > 1.0)
    except psutil.NoSuchProcess:
        return False


def _reap(pid: int) -> None:
    # A driver started by this very process (tests, the demo) must not linger as a zombie.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
