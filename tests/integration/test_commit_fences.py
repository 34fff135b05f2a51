"""The commit's two fences, promised by docs/operations.md and never triggered by a test until
#61: a replaced driver that still runs cannot commit (StaleDriverError), and a batch that does
not start where the last one ended is refused. PostgreSQL only: the version is registered by a
deploy whose driver ends at the fail point driver.start, and the batches are committed here, as
a driver's sink commits them (catalog/batches.py apply_batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import job_file
from integration.helpers import without_spark

pytestmark = [pytest.mark.integration]


def test_a_replaced_attempt_cannot_commit_and_a_batch_must_start_where_the_last_ended(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.catalog import versions
    from orchestrator.catalog.batches import StaleDriverError, apply_batch
    from orchestrator.errors import ConflictError

    # Registered, and no driver commits anything.
    service = without_spark(settings, topic, tmp_path, monkeypatch, "exit")
    deployed = service.deploy(job_file(tmp_path, "v1", topic))
    attempt = deployed.status.attempt
    s = service.settings

    def commit(attempt: int, batch_id: int, start: int, end: int) -> object:
        with service.catalog.connection() as conn:
            version = versions.get(conn, s.catalog_schema, "pageview_counts", "v1")
            # An empty write: the fences come before any row moves.
            return apply_batch(conn, s.catalog_schema, s.data_schema, version, attempt,
                               batch_id, {topic: {"0": start}}, {topic: {"0": end}}, "none")

    with pytest.raises(StaleDriverError, match=f"attempt {attempt - 1} .* was replaced"):
        commit(attempt - 1, 0, 0, 40)  # the driver that a restart replaced
    with pytest.raises(ConflictError, match=r"starts at .*@10 but the catalog has processed up "
                                            r"to 0"):
        commit(attempt, 0, 10, 40)  # a gap after the log's start
    assert commit(attempt, 0, 0, 40).applied  # type: ignore[attr-defined]
    for start in (30, 50):  # an overlap, a gap
        with pytest.raises(ConflictError, match=f"@{start} but the catalog has processed up "
                                                "to 40"):
            commit(attempt, 1, start, 60)
    assert commit(attempt, 1, 40, 60).applied  # type: ignore[attr-defined]
    assert not commit(attempt, 1, 40, 60).applied  # type: ignore[attr-defined]  # idempotent


def test_a_paused_run_is_left_queued_by_its_driver_that_has_not_stopped_yet(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#61 path 4: live first pauses a catch-up back into the queue, but a driver on another
    host is not signalled: it goes on until its next heartbeat. If it reached the log end in
    that window, queued -> caught_up raised StateError, and its catch-all then recorded
    failed, which queued allows, with an attempt that still matched: the version left the
    queue, failed. Its driver must stop and leave the run as the pause left it."""
    from orchestrator.catalog import runs, versions
    from orchestrator.catalog.batches import StaleDriverError
    from orchestrator.spark.driver import Driver
    from orchestrator.states import RunState

    service = without_spark(settings, topic, tmp_path, monkeypatch, "exit")
    attempt = service.deploy(job_file(tmp_path, "v1", topic)).status.attempt
    s = service.settings
    remote = Driver(s, "pageview_counts", "v1", attempt)  # the driver, as it runs elsewhere
    try:
        remote.set_state(RunState.REPLAYING)
        with service.catalog.connection() as conn, conn.transaction():  # live first's pause
            version = versions.get(conn, s.catalog_schema, "pageview_counts", "v1")
            paused = runs.get(conn, s.catalog_schema, version.id, for_update=True)
            runs.change_state(conn, s.catalog_schema, version, RunState.QUEUED,
                              reason="paused by live first: a test", expected=paused.as_seen())
        with pytest.raises(StaleDriverError):
            remote.set_state(RunState.CAUGHT_UP, RunState.LIVE)  # it reached the log end
        with pytest.raises(StaleDriverError):
            remote.set_state(RunState.FAILED, reason="what its catch-all records")
    finally:
        remote.conn.close()
        remote.log_clients.close()
    after = service.version_status("pageview_counts", "v1")
    assert after.state == RunState.QUEUED and after.attempt == attempt, after
    assert after.reason == "paused by live first: a test", after
