"""Waiting for a version to catch up: deferrable by default, so that no worker slot is held
while a replay runs for hours."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from orchestrator.airflow.hooks import KAFKA_CONN_ID, POSTGRES_CONN_ID, KappaHook
from orchestrator.airflow.operators import failing_clearly

if TYPE_CHECKING:
    from orchestrator.service import Orchestrator

_BACKSTOP_S = 300


class KappaCaughtUpSensor(BaseSensorOperator):
    """Succeeds when the version has replayed to the log end (at most ``max_lag`` records
    behind); fails at once if its driver failed, was stopped or stalled.

    ``max_wait_minutes`` (templated) overrides the sensor's ``timeout``. With
    ``deferrable=False`` it pokes from a worker like any sensor.
    """

    template_fields: Sequence[str] = ("job", "version", "max_lag", "max_wait_minutes")

    def __init__(self, *, job: str, version: str, max_lag: Any = 0,
                 max_wait_minutes: Any = None, deferrable: bool = True,
                 postgres_conn_id: str = POSTGRES_CONN_ID, kafka_conn_id: str = KAFKA_CONN_ID,
                 project_dir: str | None = None,
                 kappa_settings: Mapping[str, Any] | None = None, **kwargs: Any):
        kwargs.setdefault("poke_interval", 5.0)
        super().__init__(**kwargs)
        self.job, self.version, self.max_lag = job, version, max_lag
        self.max_wait_minutes, self.deferrable = max_wait_minutes, deferrable
        self.postgres_conn_id, self.kafka_conn_id = postgres_conn_id, kafka_conn_id
        self.project_dir, self.kappa_settings = project_dir, dict(kappa_settings or {})

    def _hook(self) -> KappaHook:
        return KappaHook(self.postgres_conn_id, self.kafka_conn_id, self.project_dir,
                         self.kappa_settings)

    def _timeout_s(self) -> float:
        if self.max_wait_minutes in (None, "", "None"):
            return float(self.timeout)
        return float(self.max_wait_minutes) * 60

    def poke(self, context: Any) -> bool:
        return self._caught_up(self._hook().service())

    def _caught_up(self, service: Orchestrator) -> bool:
        with failing_clearly():
            status = service.catch_up_progress(self.job, self.version,
                                               max_lag=int(self.max_lag))
        self.log.info("%s %s: %s, %s records behind", self.job, self.version,
                      status.state.value, status.lag_records)
        return status.caught_up(int(self.max_lag))

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            self.timeout = self._timeout_s()
            return super().execute(context)
        from orchestrator.airflow.hooks import public_settings
        from orchestrator.airflow.triggers import KappaCaughtUpTrigger
        from orchestrator.service import Orchestrator

        settings = self._hook().settings()
        if self._caught_up(Orchestrator(settings)):
            return {"deferred": False}
        timeout_s = self._timeout_s()
        self.defer(
            trigger=KappaCaughtUpTrigger(
                job=self.job, version=self.version, max_lag=int(self.max_lag),
                poll_interval=float(self.poke_interval),
                postgres_conn_id=self.postgres_conn_id, kafka_conn_id=self.kafka_conn_id,
                project_dir=self.project_dir, settings=public_settings(settings),
                deadline=time.time() + timeout_s),
            method_name="execute_complete",
            # The trigger reports its own deadline with the lag; this is a backstop.
            timeout=timedelta(seconds=timeout_s + _BACKSTOP_S))
        return None  # not reached: defer() raises

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "caught_up":
            raise AirflowFailException(event.get("message") or f"unexpected event {event}")
        self.log.info("%s %s caught up: %s", self.job, self.version, event)
        return {"deferred": True, **event}
