"""The archiver of the embedded default's log: `kappa archive run --all-topics` as a process of
the stack, so that the broker's memory log has a durable copy without `kappa agent`.

It archives every topic every second. A record is durable once a pass has put its segment in
place and recorded it; until then only the broker's memory holds it. `kappa dev down` stops the
archiver with SIGTERM, on which it makes one last pass up to the log end before the broker
stops.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.processes import exited, poll, start_kappa_process, stop

INTERVAL_S = 1.0
# Its last pass writes what arrived since the one before: seconds, at the rates it keeps up with.
FINAL_PASS_TIMEOUT_S = 120.0
_STARTED_S = 2.0


def start_archiver(state_dir: Path, pg_dsn: str, bootstrap: str) -> dict[str, Any]:
    """Start the stack's archiver."""
    return start_kappa_process(state_dir, "archiver", "archiver",
                               ["archive", "run", "--all-topics", "--interval", f"{INTERVAL_S:g}"],
                               pg_dsn, bootstrap, _STARTED_S)


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
