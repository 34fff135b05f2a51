"""`kappa agent` keeps this host's drivers running: one that died without a word (killed, out
of memory, a host restart) is restarted, with a pause that doubles after each restart that did
not last. Drivers that failed for a reason (a poison batch, a log that changed, a job error) are
left failed: running them again cannot help, and their reason says what to do.

Exactly-once makes a restart safe: the driver resumes from its checkpoint and the catalog.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import KappaError

log = logging.getLogger("kappa.agent")

FIRST_DELAY_S = 2.0
MAX_DELAY_S = 300.0
HEALTHY_AFTER_S = 600.0  # a driver that ran this long since its restart starts over at 2 s


@dataclass
class _Backoff:
    restarts: int = 0
    last_restart: float = 0.0

    def delay(self) -> float:
        return 0.0 if self.restarts == 0 else min(MAX_DELAY_S,
                                                  FIRST_DELAY_S * 2 ** (self.restarts - 1))


@dataclass
class Supervisor:
    service: Any  # the Orchestrator facade
    clock: Callable[[], float] = time.monotonic
    _backoff: dict[tuple[str, str], _Backoff] = field(default_factory=dict)

    def tick(self) -> list[tuple[str, str]]:
        """Restart the crashed drivers whose pause is over; return which were restarted."""
        now = self.clock()
        restarted = []
        for job, version, attempt, reason in self.service.crashed_drivers():
            backoff = self._backoff.setdefault((job, version), _Backoff())
            if backoff.restarts and now - backoff.last_restart > HEALTHY_AFTER_S:
                backoff.restarts = 0
            if backoff.restarts and now < backoff.last_restart + backoff.delay():
                continue
            try:
                status = self.service.restart(job, version)
            except KappaError as exc:
                log.warning("could not restart %s %s: %s", job, version, exc)
                backoff.last_restart, backoff.restarts = now, backoff.restarts + 1
                continue
            backoff.last_restart, backoff.restarts = now, backoff.restarts + 1
            self.service.record_event("agent_restart", job, version, failed_attempt=attempt,
                                      attempt=status.attempt, reason=reason,
                                      restarts=backoff.restarts,
                                      next_delay_s=backoff.delay())
            log.info("restarted %s %s (attempt %d): %s", job, version, status.attempt, reason)
            restarted.append((job, version))
        return restarted
