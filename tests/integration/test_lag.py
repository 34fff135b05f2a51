"""Lag against the log end: `kappa lag`, the consumer-group mirror and the lag states."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lag import Thresholds

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import output, stop_drivers
from integration.observability import agent, scrape
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "pageview_counts"
# The rates a lag reading shows are rounded to 0.1 record/s, its ETA to 0.1 s (plus a hair
# for the float arithmetic of the bounds).
RATE_ROUNDING, ETA_ROUNDING = 0.05 + 1e-9, 0.05 + 1e-9


def _assert_eta_follows_the_rates(lag: Any) -> None:
    """The ETA is the records behind over what processing gains on producing
    (orchestrator.lag.eta_seconds), 0 at the log end, None when not converging; read off the
    rounded rates that ``lag`` (a VersionLag, or its JSON) shows."""
    records, eta = _field(lag, "lag_records"), _field(lag, "eta_seconds")
    net = _field(lag, "processing_rate") - _field(lag, "produce_rate")
    slack = 2 * RATE_ROUNDING
    if records == 0:
        assert eta == 0.0, lag
    elif eta is None:
        assert net - slack <= 0, f"not converging at a net rate of {net}: {lag}"
    else:
        assert net + slack > 0, f"an ETA at a net rate of {net}: {lag}"
        low = records / (net + slack) - ETA_ROUNDING
        high = records / (net - slack) + ETA_ROUNDING if net - slack > 0 else math.inf
        assert low <= eta <= high, f"{records} behind at {net}/s implies {low}..{high}: {lag}"


def _field(lag: Any, name: str) -> Any:
    return lag[name] if isinstance(lag, dict) else getattr(lag, name)


def test_lag_equals_log_end_minus_processed_everywhere_at_rest(service, settings, topic,
                                                                tmp_path: Path) -> None:
    from orchestrator.catalog import runs, versions
    from orchestrator.catalog.db import connect
    from orchestrator.kafka.groups import committed_offsets

    service.produce_sample(topic, 20_000, seed=51)
    service.deploy(job_file(tmp_path, "v1", topic))
    service.wait(JOB, "v1", timeout_s=300)
    service.stop(JOB, "v1")
    service.produce_sample(topic, 3_000, seed=52)  # arrives while v1 is stopped: lag at rest

    ref = compute(settings.kafka_bootstrap, topic)
    with connect(settings.pg_dsn, autocommit=True) as conn:
        version = versions.get(conn, settings.catalog_schema, JOB, "v1")
        processed = runs.processed_offsets(conn, settings.catalog_schema, version.id)[topic]
    group = committed_offsets(settings.kafka_bootstrap, f"kappa.{JOB}.v1",
                              [(topic, p) for p in ref.log_end])[topic]
    assert group == processed  # the mirror shows what the catalog committed
    expected = {p: ref.log_end[p] - processed[str(p)] for p in ref.log_end}
    assert sum(expected.values()) == 3_000

    result = kappa_cli(settings, "lag", JOB, "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert {p["partition"]: p["lag_records"] for p in row["partitions"]} == expected
    assert {p["partition"]: p["log_end"] for p in row["partitions"]} == ref.log_end
    assert row["lag_records"] == 3_000 and row["state"] == "stopped"
    assert row["lag_seconds"] > 0 and row["eta_seconds"] is None  # stopped: not converging
    _assert_eta_follows_the_rates(row)
    for key in ("job", "version", "state", "lag_records", "lag_seconds", "processing_rate",
                "produce_rate", "eta_seconds", "partitions"):
        assert key in row
    statuses = service.status(JOB)
    assert statuses[0].lag_records == 3_000

    # The exporter serves the same numbers.
    with agent(settings, tmp_path, "--interval", "0.5") as target:
        def exported() -> dict[int, int] | None:
            found = {}
            for line in scrape(target).splitlines():
                match = re.match(r'kappa_partition_lag_records\{(.*)\} (\S+)$', line)
                if match and f'topic="{topic}"' in match.group(1):
                    part = int(re.search(r'partition="(\d+)"', match.group(1)).group(1))
                    found[part] = int(float(match.group(2)))
            return found if len(found) == len(expected) else None

        assert wait_until(exported, 30, "the exporter's partition lag") == expected

    # Waiting on a stopped version fails at once, with the reason.
    waited = kappa_cli(settings, "wait", JOB, "v1", "--timeout", "30")
    assert waited.returncode == 1 and "is stopped" in waited.stderr, waited.stderr

    service.restart(JOB, "v1")
    service.wait(JOB, "v1", timeout_s=300)
    (after,) = service.lag(JOB, "v1")
    assert after.lag_records == 0 and after.lag_seconds == 0.0 and after.eta_seconds == 0.0
    assert after.state == "caught_up"
    _assert_eta_follows_the_rates(after)


def test_paused_driver_is_stalled_then_recovers(settings, topic, tmp_path: Path) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, max_batch_records=10_000, chunk_records=5_000)
    service = Orchestrator(settings)
    limits = Thresholds(window_s=3.0)
    service.produce_sample(topic, 300_000, seed=61)
    service.deploy(job_file(tmp_path, "v2", topic))
    readings = []
    try:
        def gaining() -> bool:
            # A reading gaining on the log is one whose ETA says how long is left.
            return any(r.lag_records and r.processing_rate > r.produce_rate for r in readings)

        def progressed() -> object:
            if not gaining():  # one is enough: a lag read costs more than a status read
                readings.extend(service.lag(JOB, "v2", limits))
            st = service.version_status(JOB, "v2")
            done = sum(o for ps in st.processed_offsets.values() for o in ps.values())
            return st if done >= 30_000 and gaining() else None

        st = wait_until(progressed, 240, "the replay to make progress", poll_s=0.25)
        os.kill(st.pid, signal.SIGSTOP)
        try:
            # However long the machine takes to see it: the paused driver stays stalled.
            wait_until(lambda: service.lag(JOB, "v2", limits)[0].state == "stalled", 180,
                       "the paused driver to be reported stalled", poll_s=0.5)
        finally:
            os.kill(st.pid, signal.SIGCONT)

        def recovered() -> object:
            (lag,) = service.lag(JOB, "v2", limits)
            readings.append(lag)
            return lag.state in ("catching_up", "caught_up")

        wait_until(recovered, 180, "the driver to recover", poll_s=0.5)
        os.killpg(st.pid, signal.SIGKILL)
        wait_until(lambda: service.lag(JOB, "v2", limits)[0].state == "stopped", 120,
                   "the killed driver to be reported stopped", poll_s=0.5)
        for lag in readings:
            _assert_eta_follows_the_rates(lag)
        kinds = [e["detail"].get("to") for e in service.events(JOB, "v2")
                 if e["kind"] == "lag_state"]
        assert "stalled" in kinds and "stopped" in kinds  # transitions are in the event log
    finally:
        stop_drivers(service)


def test_a_driver_retrying_unreachable_reads_is_stalled_with_its_last_error(
        service, settings, topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read task times out, the query restarts again and again, no offset moves: the lag
    is not known to be small, and the version is stalled, whatever its first batch looks like
    (#19, item 9)."""
    limits = Thresholds(window_s=6.0)
    service.produce_sample(topic, 4_000, seed=63)
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "source.read=unreachable")
    service.deploy(job_file(tmp_path, "v1", topic))
    monkeypatch.delenv("KAPPA_FAIL_POINTS")
    try:
        def stalled() -> object:
            (lag,) = service.lag(JOB, "v1", limits)
            assert lag.state not in ("caught_up", "failed"), lag
            return lag if lag.state == "stalled" else None

        lag = wait_until(stalled, 180, "the retrying driver to be reported stalled", poll_s=0.5)
        assert lag.reason is not None and lag.reason.startswith(
            "retrying after unreachable service"), lag.reason
        assert "source.read" in lag.reason
        assert lag.lag_records == 4_000 and lag.run_state.value == "replaying"
        status = {st.version: st for st in service.status(JOB)}["v1"]
        assert status.reason == lag.reason
        # Once the reads succeed, the same version catches up with exact output.
        service.restart(JOB, "v1")
        service.wait(JOB, "v1", timeout_s=300)
        assert output(settings, f"{JOB}__v1") == compute(settings.kafka_bootstrap, topic).v1
    finally:
        stop_drivers(service)


def test_producer_faster_than_the_job_is_falling_behind(settings, topic, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from orchestrator.service import Orchestrator

    # A deliberately slow job: at most 300 records a micro-batch, one micro-batch a second.
    settings = replace(settings, max_batch_records=300, live_trigger_seconds=1.0)
    service = Orchestrator(settings)
    limits = Thresholds(window_s=5.0)
    service.produce_sample(topic, 100, seed=91)
    service.deploy(job_file(tmp_path, "v1", topic))
    env = dict(os.environ, **settings.driver_environment())
    producer = None
    try:
        service.wait("pageview_counts", "v1", timeout_s=300)
        producing_since = time.time()  # every record behind from here on is younger than this
        producer = subprocess.Popen(
            [str(Path(sys.executable).with_name("kappa")), "produce-sample", "--topic", topic,
             "--count", "60000", "--seed", "92", "--rate", "2000"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen = []

        def falling_behind() -> bool:
            (lag,) = service.lag(JOB, "v1", limits)
            seen.append((time.time(), lag))
            return lag.state == "falling_behind"

        wait_until(falling_behind, 40, "the falling_behind state", poll_s=0.5)
        _, last = seen[-1]
        assert last.eta_seconds is None  # not converging
        # Behind for a while: the oldest unprocessed record is measurably old, and no older
        # than the producer's start (1 s for clocks read in two processes).
        assert last.lag_seconds is not None and last.lag_seconds > 0
        for at, lag in seen:
            _assert_eta_follows_the_rates(lag)
            assert lag.lag_seconds is not None, lag
            assert 0 <= lag.lag_seconds <= at - producing_since + 1.0, (lag, at)
            assert all(p.lag_seconds is not None and 0 <= p.lag_seconds <= lag.lag_seconds
                       and p.lag_records >= 0 for p in lag.partitions)
        shown = kappa_cli(settings, "lag", JOB, "--window", "5")
        assert shown.returncode == 0 and "not converging" in shown.stdout, shown.stdout
    finally:
        if producer is not None:
            producer.kill()
            producer.wait()
        stop_drivers(service)
