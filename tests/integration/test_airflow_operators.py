"""The operators and the trigger, called directly against the real stack: a retried deploy never
deploys twice, and the catch-up trigger reports a version that cannot catch up at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conftest import job_file
from integration.airflow_env import SECRET, airflow_env

pytestmark = [pytest.mark.integration, pytest.mark.airflow]
JOB = "pageview_counts"


@pytest.fixture
def connections(settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's catalog and broker as Airflow Connections in this process's environment."""
    env = airflow_env(settings, tmp_path / "airflow", tmp_path)
    for name, value in env.items():
        if name.startswith(("AIRFLOW", "KAPPA_")):
            monkeypatch.setenv(name, value)


def test_a_retried_deploy_never_deploys_twice_and_the_trigger_reports_it_stopped(
        settings, topic, tmp_path: Path, connections: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One driver for both: the version the retried deploy started is then stopped, and the
    catch-up trigger, revived from what it stores, reports that at once."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from orchestrator.airflow.operators import KappaDeployOperator
    from orchestrator.service import Orchestrator
    from orchestrator.spark.launch import launcher

    service = Orchestrator(settings)
    service.produce_sample(topic, 1_000, seed=191)
    path = str(job_file(tmp_path, "v1", topic))
    operator = KappaDeployOperator(task_id="deploy", job_file=path)

    def lost_worker(*_: object, **__: object) -> None:
        raise OSError("worker lost")

    with monkeypatch.context() as patched:
        patched.setattr(launcher, "launch", lost_worker)
        with pytest.raises(AirflowException, match="could not launch the driver") as info:
            operator.execute({})
        assert not isinstance(info.value, AirflowFailException)  # the task's retries apply
    assert service.version_status(JOB, "v1").state.value == "failed"
    try:
        retried = operator.execute({})
        assert (retried["created"], retried["attempt"]) == (False, 2)
        assert [e["kind"] for e in service.events(JOB, "v1")].count("deploy") == 1
        assert service.version_status(JOB, "v1").state.is_active
        # The same label with other code is refused, not redeployed.
        other = job_file(tmp_path, "v2", topic).read_text().replace('VERSION = "v2"',
                                                                    'VERSION = "v1"')
        changed = tmp_path / "v1_changed.py"
        changed.write_text(other)
        with pytest.raises(AirflowFailException, match="v1"):
            KappaDeployOperator(task_id="again", job_file=str(changed)).execute({})
        # A file edited after the run checked it is refused too.
        with pytest.raises(AirflowFailException, match="changed since this run checked it"):
            KappaDeployOperator(task_id="checked", job_file=str(changed),
                                expect_version="v1",
                                expect_fingerprint=retried["fingerprint"]).execute({})
        service.stop(JOB, "v1")
    finally:
        service.stop_all()
    _the_trigger_stores_no_secret_and_reports_a_stopped_version(settings, tmp_path)


def _the_trigger_stores_no_secret_and_reports_a_stopped_version(settings, tmp_path: Path
                                                                ) -> None:
    from orchestrator.airflow.hooks import public_settings
    from orchestrator.airflow.triggers import KappaCaughtUpTrigger

    trigger = KappaCaughtUpTrigger(
        job=JOB, version="v1", max_lag=0, poll_interval=0.2,
        postgres_conn_id="kappa_postgres", kafka_conn_id="kappa_kafka",
        project_dir=str(tmp_path), settings=public_settings(settings))
    classpath, kwargs = trigger.serialize()
    assert classpath == "orchestrator.airflow.triggers.KappaCaughtUpTrigger"
    stored = json.dumps(kwargs)
    assert SECRET not in stored and settings.pg_dsn not in stored
    revived = KappaCaughtUpTrigger(**kwargs)

    async def first_event() -> dict:
        async for event in revived.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    payload = asyncio.run(asyncio.wait_for(first_event(), 60))
    assert payload["status"] == "error"
    assert "pageview_counts v1 is stopped" in payload["message"]


def test_the_conf_priority_places_the_deploy_in_the_replay_queue(
        settings, topic, tmp_path: Path, connections: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/budget.md: the DAG's conf `"priority": N` places the version in the replay queue as
    `kappa deploy --priority` does (kappa_reprocess hands the checked conf's value to the deploy
    task). The one slot is taken by a driver paused at driver.start: no JVM starts."""
    from orchestrator.airflow.operators import KappaDeployOperator

    from integration.helpers import stop_drivers, without_spark

    monkeypatch.setenv("KAPPA_REPLAY_SLOTS", "1")  # the operator's own service
    service = without_spark(settings, topic, tmp_path, monkeypatch, "pause", replay_slots=1)
    try:
        for name in ("holder", "earlier"):
            service.deploy(job_file(tmp_path, "v1", topic, name=name))
        urgent = str(job_file(tmp_path, "v1", topic, name="urgent"))
        # A Jinja-rendered conf value is a string; the checked conf's is an int.
        done = KappaDeployOperator(task_id="deploy", job_file=urgent, priority="7").execute({})
        assert done["state"] == "queued", done
        queued = [(e["job"], e["priority"], e["place"]) for e in service.replays.queue()
                  if e["state"] == "queued"]
        assert queued == [("urgent", 7, 1), ("earlier", 0, 2)], queued
    finally:
        stop_drivers(service)
