"""Processes of the embedded stack: found by their recorded PID and command line, stopped by
signals, and reaped when this process started them."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.logs import tail
from orchestrator.errors import ServiceUnavailableError
from orchestrator.process import spawn_detached

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.05


def live_process(record: dict[str, Any], prefix: str) -> psutil.Process | None:
    """The recorded process if it still runs. A reused PID runs another command line."""
    pid, cmdline = record.get(f"{prefix}_pid"), record.get(f"{prefix}_cmdline")
    if not isinstance(pid, int) or not cmdline:
        return None
    try:
        proc = psutil.Process(pid)
        if exited(proc) or proc.cmdline() != cmdline:
            return None
    except psutil.Error:
        return None
    return proc


def exited(proc: psutil.Process) -> bool:
    try:
        if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    # A broker spawned by this process stays a zombie until we reap it.
    with suppress(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)
    return True


def start_kappa_process(state_dir: Path, prefix: str, what: str, command: list[str],
                        pg_dsn: str, bootstrap: str, started_s: float) -> dict[str, Any]:
    """Start a `kappa COMMAND` process of the stack, logging to ``dev/<prefix>.log``, with the
    stack's services in its environment (never in its command line: a DSN may carry a
    password); the record keys of its PID and command line."""
    argv = [sys.executable, "-m", "orchestrator.cli.main", *command]
    env = {**os.environ, "KAPPA_STATE_DIR": str(state_dir), "KAPPA_PG_DSN": pg_dsn,
           "KAPPA_KAFKA_BOOTSTRAP": bootstrap}
    log = state_dir / "dev" / f"{what.replace(' ', '_')}.log"
    pid = spawn_detached(argv, env, log)
    proc = psutil.Process(pid)
    if poll(lambda: exited(proc), started_s):
        raise ServiceUnavailableError(
            f"the {what} exited as it started: {tail(log)}; see {log}, fix it and run `kappa "
            "dev up` again")
    return {f"{prefix}_pid": pid, f"{prefix}_cmdline": proc.cmdline()}


def stop(proc: psutil.Process, signals: tuple[signal.Signals, ...]) -> None:
    for sig in signals:
        with suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
        if poll(lambda: exited(proc), STOP_TIMEOUT_S):
            return
    raise ServiceUnavailableError(
        f"process {proc.pid} did not stop: kill it by hand and run `kappa dev down` again"
    )


def poll(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_INTERVAL_S)
    return True


def pick_port(preferred: Any) -> int:
    # The same port as last time keeps `kappa dev env` exports valid across a broker restart.
    if isinstance(preferred, int):
        with socket.socket() as sock:
            # The broker's listener sets SO_REUSEADDR too: TIME_WAIT leftovers do not block it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with suppress(OSError):
                sock.bind((HOST, preferred))
                return preferred
    return free_port()


def listens(port: int) -> bool:
    """Something accepts connections on ``port`` on loopback."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port
