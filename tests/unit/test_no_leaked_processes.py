"""No process object is left to warn when the garbage collector finds it.

pytest turns an unraisable ResourceWarning into an error of whichever test is running when the
collector runs, not of the test that left the object: in CI a cutover run, left running with two
text pipes by a failed check of test_outcome_cutover, failed test_restore on the same worker.
Started with PYTHONTRACEMALLOC=25, such a warning names the line that made the object."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestrator.spark.launch import zygote
from orchestrator.spark.launch.zygote_client import HASH_SEED_VARIABLE, SOCKET_VARIABLE


def _resource_warnings(run: Callable[[], object]) -> list[str]:
    """What ``run`` and collections after it warn of unclosed or still running resources."""
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
        gc.collect()
        while caught:  # a recorded warning holds its source: let go, it may warn in turn
            said += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
            caught.clear()
            gc.collect()
    return said


def _left_by_a_failed_check(reaped: bool) -> int:
    """Start a process with two text pipes, fail a check while it runs (reaping it on the way
    out if ``reaped``), and drop it, as a failed test's frame is dropped; its PID."""
    from integration.helpers import reap

    with contextlib.suppress(AssertionError):
        proc = subprocess.Popen(["sleep", "300"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            raise AssertionError("a check failed while the process ran")
        finally:
            if reaped:
                reap(proc)
    if not reaped:
        # It ends before its Popen is collected, unwaited (CI's cutover run finished on its
        # own): collected, the Popen reaps it. One still running would be kept until a later
        # Popen's start finds it ended, and its pipes would warn in a later test still.
        os.kill(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    return proc.pid


def test_a_process_a_failed_check_leaves_warns_later_and_one_reaped_does_not() -> None:
    warned = _resource_warnings(lambda: _left_by_a_failed_check(reaped=False))
    # What CI saw: a Popen never waited for ("still running", though its child had ended),
    # and its two text pipes.
    assert len(warned) == 3, warned
    assert sum("is still running" in w for w in warned) == 1, warned
    assert sum("unclosed file <_io.TextIOWrapper" in w for w in warned) == 2, warned

    pids: list[int] = []
    assert _resource_warnings(lambda: pids.append(_left_by_a_failed_check(reaped=True))) == []
    assert not psutil.pid_exists(pids[0])  # killed and waited for, not even a zombie


def test_a_drivers_zygote_leaves_no_process_object_behind(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The driver starts its zygote and keeps no handle on it (it ends with the driver): a
    Popen object it dropped warned at once that its subprocess still ran."""
    for variable in (SOCKET_VARIABLE, HASH_SEED_VARIABLE):
        monkeypatch.delenv(variable, raising=False)  # start() names the zygote here; undone
    started: list[int] = []
    try:
        # What it returns (its PID), the driver drops.
        assert _resource_warnings(lambda: started.append(zygote.start())) == []
    finally:
        # By its PID: other children of this worker may be zombies, whose command line is gone.
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # before its imports: they cost CPU
            os.waitpid(pid, 0)
        path = os.environ.get(SOCKET_VARIABLE)
        if path:
            shutil.rmtree(Path(path).parent, ignore_errors=True)
