"""The queue keeper of the embedded stack: `kappa queue keep` as a process of the stack, so that
a queued version starts there with no `kappa agent` (#61 path 10).

It looks every two seconds: it records as failed the catch-ups whose driver is gone, hands the
free replay slots to the queued versions and notes its look in the catalog, where `kappa queue`
finds it. It serves the catalog schema and the replay budget of the environment that `kappa dev
up` ran in (KAPPA_CATALOG_SCHEMA, KAPPA_REPLAY_SLOTS): `kappa dev down` then `kappa dev up`
change them."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psutil

from orchestrator.dev.processes import start_kappa_process, stop

INTERVAL_S = 2.0
KEYS = ("keeper_pid", "keeper_cmdline")
_STARTED_S = 1.0


def start_keeper(state_dir: Path, pg_dsn: str, bootstrap: str) -> dict[str, Any]:
    """Start the stack's queue keeper."""
    return start_kappa_process(state_dir, "keeper", "queue keeper",
                               ["queue", "keep", "--interval", f"{INTERVAL_S:g}"],
                               pg_dsn, bootstrap, _STARTED_S)


def stop_keeper(proc: psutil.Process | None) -> None:
    """SIGTERM ends it between two looks; a look under way (a driver being launched) ends
    first."""
    if proc is not None:
        stop(proc, (signal.SIGTERM, signal.SIGKILL))
