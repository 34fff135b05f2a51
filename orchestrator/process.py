"""Starting processes that outlive the command that started them (drivers, dev services), and
stopping child processes politely."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn_detached(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> int:
    """Start ``argv`` in a session of its own, stdin from /dev/null, output appended to
    ``log_path``; return its PID.

    posix_spawn rather than subprocess.Popen: the child is meant to outlive this process, and a
    Popen object dropped while its child still runs warns (ResourceWarning) when collected. The
    new session lets a stop signal the whole group (e.g. a driver and its JVM) and spares it a
    Ctrl-C in the shell that started it.
    """
    return os.posix_spawn(
        argv[0],
        list(argv),
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace_s``; reaps it either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
