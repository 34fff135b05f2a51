"""A queue keeper: a process that hands out the replay slots at a steady interval, as `kappa
agent` does at every sample, without the agent's other duties (`kappa queue keep`; the
embedded stack runs one, so that a queued version starts there with no agent).

Each look first records as failed each slot holder whose driver is gone, then hands the free
slots to the queued versions, and notes itself in the catalog (``queue_keepers``): `kappa
queue` and `kappa status` name who hands slots out, or say that nobody does. A look that fails
(PostgreSQL away, a launch refused) is said in one line and the next look tries again: a keeper
that died would leave the queue where it is."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from orchestrator.catalog.access import CatalogAccess
from orchestrator.replay_queue import slots
from orchestrator.versions import reporting

log = logging.getLogger("kappa.queue")


def keeper_name(what: str) -> str:
    """How a keeper names itself in the catalog: what it is, on which host, which process."""
    return f"{what} on {socket.gethostname()} (pid {os.getpid()})"


def look(catalog: CatalogAccess, keeper: str, every_s: float) -> list[tuple[str, str]]:
    """One look: free the slots of dead drivers, then hand out the free slots; (job, version)
    of each version started."""
    reporting.fail_dead_slot_holders(catalog)
    return slots.schedule(catalog, (keeper, every_s))


def keep(catalog: CatalogAccess, every_s: float, stop: Callable[[], bool],
         say: Callable[[str], None]) -> None:
    """Look every ``every_s`` seconds until ``stop()``."""
    keeper = keeper_name("kappa queue keep")
    failing: str | None = None
    while not stop():
        try:
            for job, version in look(catalog, keeper, every_s):
                say(f"started {job} {version} from the replay queue")
            if failing is not None:
                say("looking again: the queue is kept")
            failing = None
        except Exception as exc:  # a keeper that dies keeps no queue: say it, look again
            reason = _first_line(exc)
            if reason != failing:  # once per cause, not once a look
                say(f"a look at the replay queue failed ({reason}); trying again every "
                    f"{every_s:g}s")
            failing = reason
        deadline = time.monotonic() + every_s
        while time.monotonic() < deadline and not stop():
            time.sleep(min(0.2, every_s))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
