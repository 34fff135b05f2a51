"""A cutover task killed twice rolls back once: Airflow's second SIGTERM lands while the first's
rollback waits on the catalog, and a rollback started inside it would wait on the first's own
locks for good (in one CI run, every later catalog call waited behind it)."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_second_kill_during_the_rollback_starts_no_second_rollback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.airflow.operators import KappaCutoverOperator

    task = KappaCutoverOperator(task_id="cutover", job="pageview_counts", version="v2")
    rollbacks: list[str] = []

    class Service:
        def abort_cutover(self, job: str, version: str, **_: Any) -> int:
            rollbacks.append(version)
            task.on_kill()  # the second SIGTERM, handled inside the first rollback
            return 7

    monkeypatch.setattr(task, "service", Service)
    task.on_kill()
    assert rollbacks == ["v2"]
