"""The catalog's migrations never wedge a caller: a process that holds their lock (a killed
Airflow task whose SIGTERM handler reopened the catalog while its own first connection held
the lock, in one CI run) must not stop every other kappa command for good."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

pytestmark = [pytest.mark.integration]


def _holding_the_lock(settings: Any) -> psycopg.Connection:
    from orchestrator.catalog.migrations import _LOCK_KEY

    holder = psycopg.connect(settings.pg_dsn)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
    return holder  # the lock is held until this transaction ends


def _in_thread(work: Any, timeout_s: float) -> tuple[bool, Any]:
    """(finished within timeout_s, its result or exception)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return (not thread.is_alive(), outcome[0] if outcome else None)


def test_an_up_to_date_catalog_is_used_while_another_process_holds_the_migration_lock(
        settings: Any) -> None:
    from orchestrator.service import Orchestrator

    Orchestrator(settings).status()  # migrated
    holder = _holding_the_lock(settings)
    try:
        finished, result = _in_thread(lambda: Orchestrator(settings).status(), 20)
        assert finished, "kappa status waited for the migration lock of an up-to-date catalog"
        assert result == [], result
    finally:
        holder.close()


def test_migrations_wait_for_their_lock_a_bounded_time_and_say_who_holds_it(
        settings: Any) -> None:
    from orchestrator.errors import KappaError
    from orchestrator.service import Orchestrator

    fresh = replace(settings, catalog_schema=f"{settings.catalog_schema}_fresh")
    holder = _holding_the_lock(settings)
    began = time.monotonic()
    try:
        finished, result = _in_thread(lambda: Orchestrator(fresh).status(), 120)
        assert finished, "migrations waited for their lock for good"
        assert isinstance(result, KappaError), result
        message = str(result)
        assert "migration" in message and "\n" not in message, message
        assert f"pid {holder.info.backend_pid}" in message, message
    finally:
        holder.close()
    assert time.monotonic() - began < 120
