"""A catalog that never describes a log that is gone: a volatile broker that restarted, and a
topic deleted and recreated under a durable broker, fail the versions that read them, and no
command shows progress against the log that is there now."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import stop_drivers

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
TOPIC = "pageviews"


@pytest.fixture
def own_state() -> Iterator[Path]:
    from orchestrator.dev import stack as dev_stack

    # mkdtemp, not tmp_path: the embedded server runs as another user (see conftest.stack).
    state = Path(tempfile.mkdtemp(prefix="kappa-log-identity-"))
    try:
        yield state
    finally:
        dev_stack.down(state)
        shutil.rmtree(state, ignore_errors=True)


def _service(state: Path, memory: bool, template: object) -> tuple[object, object]:
    from orchestrator.dev import stack as dev_stack
    from orchestrator.service import Orchestrator

    up = dev_stack.up(state, memory=memory)
    settings = replace(template, state_dir=state, pg_dsn=up.pg_dsn,  # type: ignore[type-var]
                       kafka_bootstrap=up.kafka_bootstrap)
    return settings, Orchestrator(settings)  # type: ignore[arg-type]


def test_a_memory_broker_restart_fails_every_version_and_no_command_shows_progress(
    own_state: Path, settings: object, tmp_path: Path
) -> None:
    from orchestrator.dev import stack as dev_stack
    from orchestrator.errors import LogChangedError, StateError
    from orchestrator.metrics.exporter import lag_metrics

    settings, service = _service(own_state, True, settings)
    try:
        service.produce_sample(TOPIC, 6_000, seed=61)
        for version in ("v1", "v2"):
            service.deploy(job_file(tmp_path, version, TOPIC))
        for version in ("v1", "v2"):
            service.wait(JOB, version, timeout_s=240)
        service.promote(JOB, "v1", force=True, reason="first")
        service.promote(JOB, "v2", force=True, reason="second")  # rollback would go to v1
        service.stop_all()
        dev_stack.down(own_state)
        settings, service = _service(own_state, True, settings)
        # More records than the versions read: offsets alone would look plausible.
        service.produce_sample(TOPIC, 9_000, seed=62)

        statuses = {st.version: st for st in service.status(JOB)}
        for st in statuses.values():
            assert st.state.value == "failed" and st.log_gone, st
            assert "another cluster" in (st.reason or "") and "new VERSION" in (st.reason or "")
            assert st.lag_records is None
        table = kappa_cli(settings, "status").stdout
        assert "(of a log that is gone)" in table and f"{TOPIC}/0:" not in table

        lags = json.loads(kappa_cli(settings, "lag", "--json").stdout)
        assert {lg["version"]: lg["state"] for lg in lags} == {"v1": "log_gone", "v2": "log_gone"}
        assert all(lg["lag_records"] is None and lg["partitions"] == [] for lg in lags)
        text = kappa_cli(settings, "lag", "--partitions").stdout
        assert "log gone" in text and "%" not in text
        exported = {family.name: family.samples for family in lag_metrics(service.lag(JOB))}
        for name in ("kappa_lag_records", "kappa_partition_lag_records", "kappa_eta_seconds",
                     "kappa_processed_offset"):
            assert exported[name] == [], name
        assert {(s.labels["version"], s.value) for s in exported["kappa_state"]
                if s.labels["state"] == "log_gone"} == {("v1", 1.0), ("v2", 1.0)}

        with pytest.raises(LogChangedError, match="another cluster"):
            service.restart(JOB, "v2")
        with pytest.raises(StateError, match="whose log is gone"):
            service.rollback(JOB)
        with pytest.raises(StateError, match="the log it read is gone"):
            service.promote(JOB, "v1")
        forced = kappa_cli(settings, "rollback", JOB, "--force", "--reason", "reading v1 anyway")
        assert forced.returncode == 0, forced.stderr
        last = service.history(JOB)[-1]
        assert last["action"] == "rollback" and last["reason"] == "reading v1 anyway"
        assert last["forced"], last
    finally:
        stop_drivers(service)


@pytest.mark.broker_storage("archive")
def test_a_topic_recreated_under_a_durable_broker_fails_the_versions_that_read_it(
    own_state: Path, settings: object, tmp_path: Path
) -> None:
    from orchestrator.errors import KappaError
    from orchestrator.kafka.admin import ensure_topic

    settings, service = _service(own_state, False, settings)
    other = "clicks"
    try:
        service.produce_sample(TOPIC, 5_000, seed=63)
        service.produce_sample(other, 2_000, seed=64)
        service.deploy(job_file(tmp_path, "v1", TOPIC))
        service.deploy(job_file(tmp_path, "v1", other, name="click_counts"))
        service.wait(JOB, "v1", timeout_s=240)
        service.wait("click_counts", "v1", timeout_s=240)

        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        admin.delete_topics([TOPIC], operation_timeout=10)[TOPIC].result()

        def recreated() -> bool:
            try:
                return ensure_topic(settings.kafka_bootstrap, TOPIC, 4)
            except KappaError:  # the deletion still under way
                return False

        wait_until(recreated, 30, f"{TOPIC} to be created again")
        service.produce_sample(TOPIC, 8_000, seed=65)  # more than v1 had read

        st = service.version_status(JOB, "v1")
        assert st.state.value == "failed" and st.log_gone and st.lag_records is None, st
        assert f"topic {TOPIC} was deleted and recreated" in (st.reason or ""), st.reason
        assert service.version_status("click_counts", "v1").state.value == "live"
        (event,) = [e for e in service.events(JOB, "v1")
                    if e["kind"] == "state" and e["detail"]["to"] == "failed"]
        assert TOPIC in event["detail"]["reason"]
    finally:
        stop_drivers(service)
