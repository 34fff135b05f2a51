"""The replay queue without `kappa agent` (#61 path 5): a slot held by a driver that died is
freed for those who wait on the queue, with no JVM started (the fail point driver.start ends
each driver before its Spark session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import job_file, wait_until
from integration.helpers import query, without_spark

pytestmark = [pytest.mark.integration]


def test_a_slot_held_by_a_dead_driver_is_freed_for_a_version_waiting_in_the_queue(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kappa deploy --wait` (and `kappa wait`, Airflow's trigger) of a queued version hands
    out free slots, but counted a slot held by a run whose driver had died as taken: with no
    agent to record the death, the queued version waited out its timeout."""
    from orchestrator.errors import KappaError, StateError
    from orchestrator.states import RunState

    # Each driver ends as it starts, as a driver killed by the OOM killer would: no state
    # recorded, its run left `starting` with its PID, holding the one slot.
    service = without_spark(settings, topic, tmp_path, monkeypatch, "exit", replay_slots=1)
    service.deploy(job_file(tmp_path, "v1", topic, name="holder"))
    first = service.deploy(job_file(tmp_path, "v1", topic, name="waiter"))
    assert first.status.state == RunState.QUEUED, first.status
    # Read from the catalog: a status look would record the holder's death itself.
    schema = settings.catalog_schema  # type: ignore[attr-defined]
    ((state, pid),) = query(settings, f"SELECT r.state, r.pid FROM {schema}.runs r JOIN "
                            f"{schema}.job_versions v ON v.id = r.version_id "
                            "WHERE v.job = 'holder'")
    assert state == "starting" and pid is not None, (state, pid)
    wait_until(lambda: not _alive(pid), 30, "the holder's driver to end at driver.start")

    # One look by a process waiting for the queued version frees the slot and starts it.
    with pytest.raises(KappaError) as ended:  # not "has not caught up after 10s", queued
        service.wait("waiter", "v1", timeout_s=10, poll_s=0.5)
    # It left the queue, and its own driver ended at driver.start too.
    assert isinstance(ended.value, StateError) and "is failed" in str(ended.value), ended.value
    assert service.version_status("holder", "v1").state == RunState.FAILED
    waiter = service.version_status("waiter", "v1")
    assert waiter.state == RunState.FAILED and waiter.attempt == 1, waiter


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
