"""`kappa dev up` brings the stack back on its first call after a SIGKILL of its PostgreSQL,
even when the dead postmaster lingers as a zombie that nobody reaps (its parent, the `kappa`
that started it, is gone)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import psycopg
import pytest

from conftest import wait_until

pytestmark = pytest.mark.integration


def _kappa(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # This stack deploys nothing: a warm spare (test_archived_stack.py) would only take CPU.
    env = dict(os.environ, KAPPA_STATE_DIR=str(state_dir), KAPPA_WARM_SPARES="0")
    return subprocess.run([str(Path(sys.executable).with_name("kappa")), *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def test_dev_up_after_postgres_was_killed_works_at_once(tmp_path: Path) -> None:
    from orchestrator.dev import stack

    # Not tmp_path for the state: the embedded server runs as another user (conftest.stack).
    state_dir = Path(tempfile.mkdtemp(prefix="kappa-dev-recovery-"))
    try:
        assert _kappa(state_dir, "dev", "up", "--memory").returncode == 0
        first = stack.status(state_dir)
        assert first.postgres.pid
        os.kill(first.postgres.pid, signal.SIGKILL)
        wait_until(lambda: not stack.status(state_dir).postgres.running, 30,
                   "PostgreSQL to be gone")

        again = _kappa(state_dir, "dev", "up")
        assert again.returncode == 0, again.stderr
        assert "Traceback" not in again.stderr + again.stdout
        second = stack.status(state_dir)
        assert second.running and second.postgres.pid != first.postgres.pid
        with psycopg.connect(second.pg_dsn or "") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # The broker lived on: the same process, the same log.
        assert second.broker.pid == first.broker.pid
    finally:
        stack.down(state_dir)
        for proc in psutil.process_iter(["cmdline"]):
            if str(state_dir) in " ".join(proc.info["cmdline"] or []):
                proc.kill()
        shutil.rmtree(state_dir, ignore_errors=True)
