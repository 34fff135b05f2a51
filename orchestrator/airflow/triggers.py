"""The trigger behind the deferrable catch-up sensor: it polls the catalog from the triggerer,
so a replay of hours holds no worker slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

# A stall is judged from measured lag, which costs broker round trips: do it every few polls.
_STALL_CHECK_EVERY_S = 5.0


class KappaCaughtUpTrigger(BaseTrigger):
    """Fires once the version is caught up (``caught_up``), or with ``error`` when it failed,
    was stopped or stalled. Its stored arguments hold connection ids, never a password."""

    def __init__(self, *, job: str, version: str, max_lag: int, poll_interval: float,
                 postgres_conn_id: str, kafka_conn_id: str, project_dir: str | None,
                 settings: dict[str, str], deadline: float | None = None):
        super().__init__()
        self.job, self.version, self.max_lag = job, version, max_lag
        self.deadline = deadline  # epoch seconds; a resumed trigger keeps the original one
        self.poll_interval = poll_interval
        self.postgres_conn_id, self.kafka_conn_id = postgres_conn_id, kafka_conn_id
        self.project_dir, self.settings = project_dir, settings

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "job": self.job, "version": self.version, "max_lag": self.max_lag,
            "poll_interval": self.poll_interval, "postgres_conn_id": self.postgres_conn_id,
            "kafka_conn_id": self.kafka_conn_id, "project_dir": self.project_dir,
            "settings": self.settings, "deadline": self.deadline})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from orchestrator.airflow.hooks import KappaHook
        from orchestrator.errors import KappaError, ServiceUnavailableError

        hook = KappaHook(self.postgres_conn_id, self.kafka_conn_id, self.project_dir,
                         self.settings)
        service = await hook.aservice()
        next_stall_check = 0.0
        while True:
            check_stall = time.monotonic() >= next_stall_check
            if check_stall:
                next_stall_check = time.monotonic() + _STALL_CHECK_EVERY_S
            try:
                status = await asyncio.to_thread(
                    service.catch_up_progress, self.job, self.version, max_lag=self.max_lag,
                    check_stall=check_stall)
            except ServiceUnavailableError as exc:
                self.log.warning("cannot check %s %s now (%s); trying again", self.job,
                                 self.version, exc)
            except KappaError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            else:
                if status.caught_up(self.max_lag):
                    yield TriggerEvent({"status": "caught_up", "state": status.state.value,
                                        "lag_records": status.lag_records, "rows": status.rows,
                                        "dead_letters": status.dead_letters})
                    return
                self.log.info("%s %s: %s, %s records behind", self.job, self.version,
                              status.state.value, status.lag_records)
                if self.deadline is not None and time.time() >= self.deadline:
                    yield TriggerEvent({"status": "timeout", "message": (
                        f"{self.job} {self.version} has not caught up in time: "
                        f"{status.state.value}, {status.lag_records} records behind. It keeps "
                        f"running: raise catch_up_timeout_minutes and clear this task, or "
                        f"`kappa lag {self.job}` / `kappa stop {self.job} {self.version}`")})
                    return
            await asyncio.sleep(self.poll_interval)
