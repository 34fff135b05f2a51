"""The archiver of the embedded default's log: `kappa archive run --all-topics` as a process of
the stack, so that the broker's memory log has a durable copy without `kappa agent`.

It archives every topic every second. A record is durable once a pass has put its segment in
place and recorded it; until then only the broker's memory holds it. `kappa dev down` stops the
archiver with SIGTERM, on which it makes one last pass up to the log end before the broker
stops.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.logs import tail
from orchestrator.dev.processes import exited, poll, stop
from orchestrator.errors import ServiceUnavailableError
from orchestrator.process import spawn_detached

INTERVAL_S = 1.0
# Its last pass writes what arrived since the one before: seconds, at the rates it keeps up with.
FINAL_PASS_TIMEOUT_S = 120.0
_STARTED_S = 2.0


def start_archiver(state_dir: Path, pg_dsn: str, bootstrap: str) -> dict[str, Any]:
    """Start the stack's archiver, with the stack's services in its environment (never in its
    command line: a DSN may carry a password)."""
    argv = [sys.executable, "-m", "orchestrator.cli.main", "archive", "run", "--all-topics",
            "--interval", f"{INTERVAL_S:g}"]
    env = {**os.environ, "KAPPA_STATE_DIR": str(state_dir), "KAPPA_PG_DSN": pg_dsn,
           "KAPPA_KAFKA_BOOTSTRAP": bootstrap}
    log = state_dir / "dev" / "archiver.log"
    pid = spawn_detached(argv, env, log)
    proc = psutil.Process(pid)
    if poll(lambda: exited(proc), _STARTED_S):
        raise ServiceUnavailableError(
            f"the archiver exited as it started: {tail(log)}; see {log}, fix it and run `kappa "
            "dev up` again")
    return {"archiver_pid": pid, "archiver_cmdline": proc.cmdline()}


def stop_archiver(proc: psutil.Process) -> bool:
    """SIGTERM: the archiver finishes its pass and makes a last one up to the log end. True if
    it exited by itself (its last pass ran), False if it was gone or had to be killed."""
    try:
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return False
    if poll(lambda: exited(proc), FINAL_PASS_TIMEOUT_S):
        return True
    stop(proc, (signal.SIGKILL,))
    return False
