"""Crashes in the window between a batch's PostgreSQL commit and Spark's commit log, made
certain by fail points (KAPPA_FAIL_POINTS), for a batch job and a stream job with state.

A re-run batch that the catalog already holds must still run a stream job's plan, so that its
state store writes the next version; only the apply is skipped. Each version resumes with
output equal to a reference computed from the log."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, wait_until
from integration.helpers import assert_batches_tile_the_log, output, stop_drivers
from integration.stream_helpers import example, table
from reference import compute
from reference_streams import Log, read_records, url_visitors

pytestmark = [pytest.mark.integration, pytest.mark.spark]
POINTS = ("batch.after_pg_commit", "batch.before_spark_commit")
URL_COLUMNS = ["visitors", "first_seen", "last_seen"]


def _query_failures(log_path: str | None, attempt: int) -> list[str]:
    """The driver's "query failed" lines of one attempt: a resumed version needs none."""
    assert log_path
    text = Path(log_path).read_text(errors="replace")
    since = text.rsplit(f"=== attempt {attempt} starting", 1)[-1]
    return [line[:300] for line in since.splitlines() if "query failed" in line]


Crash = tuple[str, str, str, Callable[[], object]]  # job, version, fail point, deploy


def _crash_then_restart(service, monkeypatch, crashes: list[Crash]) -> None:
    """Deploy each (job, version) with its fail point set to end the driver at its third batch,
    see each driver die, then restart them all without fail points."""
    for _job, _version, point, deploy in crashes:
        monkeypatch.setenv("KAPPA_FAIL_POINTS", f"{point}=2*off->1*exit")
        deploy()
    monkeypatch.delenv("KAPPA_FAIL_POINTS")
    for job, version, _point, _deploy in crashes:
        wait_until(lambda j=job, v=version: service.version_status(j, v).state.value == "failed",
                   240, f"{job} {version}'s driver to exit at its fail point")
        st = service.version_status(job, version)
        assert "is gone" in (st.reason or ""), st.reason
        assert sum(o for ps in st.processed_offsets.values() for o in ps.values()) > 0
        service.restart(job, version)


def test_stream_job_resumes_exactly_after_a_crash_between_the_two_commits(
        settings, tmp_path: Path, monkeypatch) -> None:
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, max_batch_records=3_000, chunk_records=1_500))
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, 15_000, seed=81, users=200)
    labels = {f"crash{i}": point for i, point in enumerate(POINTS)}
    try:
        _crash_then_restart(service, monkeypatch, [
            ("url_visitors", label, point,
             lambda v=label: service.deploy(example(tmp_path, "url_visitors",
                                                    {"pageviews": topic}, version=v)))
            for label, point in labels.items()])
        reference = url_visitors(Log(read_records(settings.kafka_bootstrap, topic), []))
        assert reference
        for version in labels:
            st = service.wait("url_visitors", version, timeout_s=300)
            assert st.attempt == 2
            # The batch the catalog held ran its plan: its state was written, Spark's commit
            # found every state store committed, and no query had to be started again.
            assert _query_failures(st.log_path, 2) == []
            assert table(settings, f"url_visitors__{version}", "url", URL_COLUMNS) == reference
    finally:
        stop_drivers(service)


def test_stream_job_goes_on_after_an_error_raised_past_the_postgres_commit(
        settings, tmp_path: Path, monkeypatch) -> None:
    """The same window without a crash: an error after the commit (as a psycopg error from the
    caught-up check when PostgreSQL restarts) makes the same process run the batch again."""
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, max_batch_records=3_000, chunk_records=1_500))
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, 12_000, seed=82, users=200)
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.after_pg_commit=1*off->1*raise")
    try:
        service.deploy(example(tmp_path, "url_visitors", {"pageviews": topic}, version="raised"))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        st = service.wait("url_visitors", "raised", timeout_s=300)
        assert st.attempt == 1  # the driver's own retry, no restart
        (failure,) = _query_failures(st.log_path, 1)  # the fail point's, and no other
        assert "FailPointError" in failure
        reference = url_visitors(Log(read_records(settings.kafka_bootstrap, topic), []))
        assert table(settings, "url_visitors__raised", "url", URL_COLUMNS) == reference
    finally:
        stop_drivers(service)


def test_batch_job_resumes_exactly_after_a_crash_between_the_two_commits(
        settings, tmp_path: Path, monkeypatch) -> None:
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, max_batch_records=3_000, chunk_records=1_500))
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    service.produce_sample(topic, 12_000, seed=83)
    jobs = {f"crash{i}": point for i, point in enumerate(POINTS)}
    try:
        _crash_then_restart(service, monkeypatch, [
            (f"counts_{name}", "v1", point,
             lambda n=name: service.deploy(job_file(tmp_path, "v1", topic, name=f"counts_{n}")))
            for name, point in jobs.items()])
        ref = compute(settings.kafka_bootstrap, topic)
        for name in jobs:
            job = f"counts_{name}"
            assert service.wait(job, "v1", timeout_s=300).attempt == 2
            assert output(settings, f"{job}__v1") == ref.v1
            assert_batches_tile_the_log(settings, job, "v1", topic, ref.log_end)
    finally:
        stop_drivers(service)


def test_caught_up_is_measured_on_a_timer_once_the_log_goes_quiet(
        settings, topic, tmp_path: Path, monkeypatch) -> None:
    """The lag measured when the catch-up ends is unknown (the broker did not answer, here a
    fail point), so the version goes live before it can say it caught up. No record arrives
    after that: no commit comes to trigger a check, and only a timer can record caught_up.

    Caught up and live are recorded at once: no reader sees a version that caught up but is
    not live (``wait`` returned one in CI when its poll fell between two transactions; the
    second fail point holds that moment open until the test has looked)."""
    from orchestrator.errors import KappaError
    from orchestrator.failpoints import release
    from orchestrator.service import Orchestrator

    service = Orchestrator(settings)
    service.produce_sample(topic, 3_000, seed=84)
    released = tmp_path / "released"
    released.mkdir()
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "driver.measure_lag=1*raise;driver.going_live=1*pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
    try:
        service.deploy(job_file(tmp_path, "v1", topic))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")

        def driver_log() -> str:
            path = service.version_status("pageview_counts", "v1").log_path
            return Path(path).read_text() if path and Path(path).exists() else ""

        wait_until(lambda: "fail point driver.going_live: paused" in driver_log(), 120,
                   "caught_up to be recorded, not yet committed")
        # Held between the two: nobody sees caught_up, and wait goes on waiting.
        assert service.version_status("pageview_counts", "v1").state.value not in (
            "caught_up", "live")
        with pytest.raises(KappaError, match="has not caught up"):
            service.wait("pageview_counts", "v1", timeout_s=3)
        release(released, "driver.going_live")
        st = service.wait("pageview_counts", "v1", timeout_s=120)
        assert st.state.value == "live" and st.lag_records == 0
        log = Path(st.log_path or "").read_text()
        assert "cannot measure the lag" in log  # the fail point fired
    finally:
        stop_drivers(service)
