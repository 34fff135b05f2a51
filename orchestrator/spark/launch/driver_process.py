"""Whether a driver's process still runs, and stopping its whole process group: used by the
launcher and by the warm spares (which must not import the launcher, which adopts them)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil


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
        _kill_group(pid, signal.SIGKILL)  # leftovers (the JVM) of a driver that died
        return
    _kill_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_alive(pid, started):
        time.sleep(0.1)
    _kill_group(pid, signal.SIGKILL)
    _reap(pid)


def _kill_group(pid: int | None, sig: signal.Signals) -> None:
    if not pid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _reap(pid: int) -> None:
    # A driver started by this very process (tests, the demo) must not linger as a zombie.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
