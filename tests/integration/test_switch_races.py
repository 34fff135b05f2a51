"""Switch gates are checked under the alias's lock: two promotes validated against the same
version cannot both pass, a retire cannot race a promote, and a rollback to a retired version
is refused like one to a stopped or failed version.

The races are made certain, not hoped for: the test holds the alias row's lock while the
switches pass their first checks, and lets them go once all of them wait for it."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from conftest import job_file, wait_until
from integration.helpers import stop_drivers

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"


def _held(settings) -> psycopg.Connection:
    conn = psycopg.connect(settings.pg_dsn, autocommit=False)
    conn.execute(sql.SQL("SELECT 1 FROM {}.aliases WHERE name = %s FOR UPDATE").format(
        sql.Identifier(settings.catalog_schema)), (JOB,))
    return conn


def _waiting(settings, count: int) -> bool:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s", (f"%{settings.catalog_schema}%aliases%FOR UPDATE%",)
        ).fetchone()
    return bool(row and row[0] >= count)


def _race(settings, calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run ``calls`` in threads while the alias row is locked; release it once they all wait
    on it. Each call's result, or the exception it raised."""
    results: dict[str, Any] = {}
    holder = _held(settings)

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            results[name] = call()
        except Exception as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: _waiting(settings, len(calls)), 120,
                   f"{', '.join(calls)} to wait on the alias's lock")
    finally:
        holder.rollback()
        holder.close()
    for thread in threads:
        thread.join(120)
    return results


def test_switch_gates_hold_under_the_alias_lock(settings, topic, tmp_path: Path) -> None:
    from orchestrator.errors import StateError
    from orchestrator.service import Orchestrator

    settings = replace(settings, serving_schema=f"serving_{uuid.uuid4().hex[:8]}")
    service = Orchestrator(settings)
    service.produce_sample(topic, 6_000, seed=73)
    v3 = job_file(tmp_path, "v2", topic)
    v3 = v3.rename(v3.with_name("pageview_counts_v3.py"))
    v3.write_text(re.sub(r'^VERSION = .*$', 'VERSION = "v3"', v3.read_text(), flags=re.M))
    try:
        for path in (job_file(tmp_path, "v1", topic), job_file(tmp_path, "v2", topic), v3):
            service.deploy(path)
        for version in ("v1", "v2", "v3"):
            service.wait(JOB, version, timeout_s=300)
        service.promote(JOB, "v1", force=True, reason="first version")
        assert service.diff(JOB, "v1", "v2").passed and service.diff(JOB, "v1", "v3").passed

        # Two promotes, each validated against v1: the second to get the lock finds the alias
        # serving the other one, against which it was never validated.
        raced = _race(settings, {v: lambda v=v: Orchestrator(settings).promote(JOB, v)
                                 for v in ("v2", "v3")})
        won = [v for v, r in raced.items() if isinstance(r, dict)]
        lost = [v for v, r in raced.items() if isinstance(r, Exception)]
        assert len(won) == 1 and len(lost) == 1, raced
        assert isinstance(raced[lost[0]], StateError), raced
        assert f"not against {won[0]}, which the alias serves" in str(raced[lost[0]])
        assert service.serving(JOB).primary == won[0]  # type: ignore[union-attr]

        # A retire of the version a promote is about to serve: one of them is refused.
        loser = lost[0]
        assert service.diff(JOB, won[0], loser).passed
        raced = _race(settings, {
            "promote": lambda: Orchestrator(settings).promote(JOB, loser),
            "retire": lambda: Orchestrator(settings).retire(JOB, loser)})
        assert sum(isinstance(r, Exception) for r in raced.values()) == 1, raced
        serving = service.serving(JOB)
        retired = service.version_status(JOB, loser).state.value == "retired"
        assert not (serving.primary == loser and retired), (serving, raced)  # type: ignore[union-attr]

        # A rollback to a retired version is refused unless forced.
        if not retired:
            service.promote(JOB, won[0], force=True, reason="back to the winner")
        target = service.serving(JOB).rollback_to  # type: ignore[union-attr]
        assert target
        if service.version_status(JOB, target).state.value != "retired":
            service.retire(JOB, target)
        with pytest.raises(StateError, match=f"{JOB} {target}, which is retired"):
            service.rollback(JOB)
        assert service.serving(JOB).primary == won[0]  # type: ignore[union-attr]
        assert service.rollback(JOB, force=True, reason="on purpose")["primary"] == target
        assert service.history(JOB)[-1]["forced"]
    finally:
        stop_drivers(service)
