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
URL_COLUMNS = ["visitors", "first_seen", "last_seen"]
# One driver per attempt: the first ends after the PostgreSQL commit of its third batch; the
# second re-runs that batch (held by the catalog: no apply, no after_pg_commit), applies the next
# and ends before Spark's commit log has it; the third runs clean to the end of the log.
CRASHES = ("batch.after_pg_commit=2*off->1*exit", "batch.before_spark_commit=1*off->1*exit")


def _query_failures(log_path: str | None, attempt: int) -> list[str]:
    """The driver's "query failed" lines from an attempt on: a resumed version needs none."""
    assert log_path
    text = Path(log_path).read_text(errors="replace")
    since = text.rsplit(f"=== attempt {attempt} starting", 1)[-1]
    return [line[:300] for line in since.splitlines() if "query failed" in line]


def _processed(service, job: str, version: str) -> int:
    st = service.version_status(job, version)
    return sum(o for ps in st.processed_offsets.values() for o in ps.values())


def _crash_twice_then_restart(service, monkeypatch, deploys: dict[tuple[str, str],
                                                                  Callable[[], object]]) -> None:
    """Deploy each (job, version), see its driver die at each of CRASHES in turn (a restart
    after each), then restart it without fail points."""
    done = {key: 0 for key in deploys}
    for attempt, points in enumerate(CRASHES, 1):
        monkeypatch.setenv("KAPPA_FAIL_POINTS", points)
        for (job, version), deploy in deploys.items():
            if attempt == 1:
                deploy()
            else:
                service.restart(job, version)
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        for job, version in deploys:
            wait_until(lambda j=job, v=version: service.version_status(j, v).state.value
                       == "failed", 300, f"{job} {version}'s driver to exit at {points}")
            st = service.version_status(job, version)
            assert st.attempt == attempt and "is gone" in (st.reason or ""), st
            # Each driver committed a batch of its own to PostgreSQL before its end.
            before, done[job, version] = done[job, version], _processed(service, job, version)
            assert done[job, version] > before, (job, version, attempt, done[job, version])
    for job, version in deploys:
        service.restart(job, version)


def test_jobs_resume_exactly_after_crashes_between_the_two_commits_or_an_error_past_one(
        settings, tmp_path: Path, monkeypatch) -> None:
    """A stream job with state and a batch job, each crashed in both windows; and beside them
    the first window without a crash: an error after the commit (as a psycopg error from the
    caught-up check when PostgreSQL restarts) makes the same process run the batch again."""
    from orchestrator.service import Orchestrator

    service = Orchestrator(replace(settings, max_batch_records=3_000, chunk_records=1_500))
    topic = f"pageviews_{uuid.uuid4().hex[:8]}"
    # Five batches of 3,000: two attempts end inside them, and the third has one left to run.
    service.produce_sample(topic, 15_000, seed=81, users=200)
    try:
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "batch.after_pg_commit=1*off->1*raise")
        service.deploy(example(tmp_path, "url_visitors", {"pageviews": topic}, version="raised"))
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        _crash_twice_then_restart(service, monkeypatch, {
            ("url_visitors", "crashed"): lambda: service.deploy(example(
                tmp_path, "url_visitors", {"pageviews": topic}, version="crashed")),
            ("pageview_counts", "v1"): lambda: service.deploy(job_file(tmp_path, "v1", topic))})
        reference = url_visitors(Log(read_records(settings.kafka_bootstrap, topic), []))
        assert reference
        st = service.wait("url_visitors", "crashed", timeout_s=300)
        assert st.attempt == 3
        # Each batch the catalog held ran its plan: its state was written, Spark's commit
        # found every state store committed, and no query had to be started again.
        assert _query_failures(st.log_path, 2) == []
        assert table(settings, "url_visitors__crashed", "url", URL_COLUMNS) == reference

        st = service.wait("url_visitors", "raised", timeout_s=300)
        assert st.attempt == 1  # the driver's own retry, no restart
        (failure,) = _query_failures(st.log_path, 1)  # the fail point's, and no other
        assert "FailPointError" in failure
        assert table(settings, "url_visitors__raised", "url", URL_COLUMNS) == reference

        ref = compute(settings.kafka_bootstrap, topic)
        assert service.wait("pageview_counts", "v1", timeout_s=300).attempt == 3
        assert output(settings, "pageview_counts__v1") == ref.v1
        assert_batches_tile_the_log(settings, "pageview_counts", "v1", topic, ref.log_end)
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

        # A cold driver's start and catch-up: over 120 s once, under a load of 50 on 2 cores.
        wait_until(lambda: "fail point driver.going_live: paused" in driver_log(), 300,
                   "caught_up to be recorded, not yet committed")
        # Held between the two: nobody sees caught_up, and wait goes on waiting.
        assert service.version_status("pageview_counts", "v1").state.value not in (
            "caught_up", "live")
        with pytest.raises(KappaError, match="has not caught up"):
            service.wait("pageview_counts", "v1", timeout_s=3)
        release(released, "driver.going_live")
        st = service.wait("pageview_counts", "v1", timeout_s=300)
        assert st.state.value == "live" and st.lag_records == 0
        log = Path(st.log_path or "").read_text()
        assert "cannot measure the lag" in log  # the fail point fired
    finally:
        stop_drivers(service)
