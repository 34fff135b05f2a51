"""docs/cutover.md: the alias's view is redefined when a version is deployed, with lock_timeout
bounding every attempt. The DDL's lock waits for a reader's open transaction, and new readers
queue behind it: unbounded, a reader that keeps its transaction open would stop every other
reader of the alias for as long as the deploy waits. PostgreSQL and the broker only: each
deploy's driver ends at the fail point driver.start, and the alias is promoted with --force."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import job_file, wait_until
from integration.helpers import without_spark

pytestmark = [pytest.mark.integration]


def test_a_deploy_under_a_reader_holding_the_alias_never_stops_the_other_readers(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = without_spark(settings, topic, tmp_path, monkeypatch, "exit")
    service.deploy(job_file(tmp_path, "v1", topic))
    service.promote("pageview_counts", "v1", force=True, reason="a test of the view's locks")
    s = service.settings
    alias = sql.Identifier(s.serving_schema, "pageview_counts")
    with psycopg.connect(s.pg_dsn) as holding, \
            psycopg.connect(s.pg_dsn, autocommit=True) as other, \
            psycopg.connect(s.pg_dsn, autocommit=True) as watcher:
        holding.execute(sql.SQL("SELECT count(*) FROM {}").format(alias))  # its lock stays
        failed: list[BaseException] = []

        def deploy() -> None:
            try:
                service.deploy(job_file(tmp_path, "v2", topic))
            except BaseException as exc:  # reported by the test's thread
                failed.append(exc)

        deploying = threading.Thread(target=deploy, daemon=True)
        deploying.start()
        try:
            wait_until(lambda: watcher.execute(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'CREATE OR REPLACE VIEW%%')").fetchone()[0],  # type: ignore[index]
                60, "the deploy's view definition to wait for the reader's lock", poll_s=0.05)
            # Readers arriving meanwhile wait at most one attempt's lock_timeout (500 ms).
            other.execute("SET statement_timeout = '5s'")
            for _ in range(5):
                other.execute(sql.SQL("SELECT count(*) FROM {}").format(alias))
            assert deploying.is_alive(), f"the deploy ended with the reader's lock held: {failed}"
        finally:
            holding.rollback()
            deploying.join(60)
    assert not deploying.is_alive() and failed == [], failed
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        definition = conn.execute("SELECT pg_get_viewdef(%s::regclass)", (
            f'"{s.serving_schema}"."pageview_counts"',)).fetchone()
    assert definition is not None and "pageview_counts__v2" in definition[0], definition
