"""Chaos under a stream job with state while a producer writes: PostgreSQL's postmaster is
SIGKILLed and started again, the driver is SIGKILLed, and drivers die at the fail points
between a batch's two commits, at random moments. The version comes back to caught_up with a
table equal to the reference computed from the log."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from conftest import wait_until
from integration.helpers import own_stack
from integration.stream_helpers import example, table
from reference_streams import Log, read_records, url_visitors

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOB = "url_visitors"
COLUMNS = ["visitors", "first_seen", "last_seen"]
POINTS = ("batch.after_pg_commit", "batch.before_spark_commit")
FIRST, PRODUCED = 6_000, 40_000  # records before the deploy, and written during the chaos
TOTAL = FIRST + PRODUCED


def _wait_for_death(service, pid: int, why: str, timeout_s: float) -> None:
    """Wait for the driver ``pid`` to end. The process is pinned by its create time: with
    32,768 PIDs, which the suite's JVM threads go through in minutes, a bare PID can name
    another process by the time it is polled. On timeout, what the driver was doing is printed."""
    from orchestrator.spark.launch import launcher

    try:
        driver = psutil.Process(pid)
        started = driver.create_time()
    except psutil.NoSuchProcess:
        return
    began = time.monotonic()
    try:
        wait_until(lambda: not launcher.is_alive(pid, started), timeout_s,
                   f"the driver to die ({why})")
        print(f"driver {pid} ended {time.monotonic() - began:.1f}s after the {why}")
    except AssertionError:
        st = service.version_status(JOB, "v1")
        with suppress(psutil.Error):
            print(f"driver {pid}: {driver.status()}, {driver.cmdline()[:4]}, "
                  f"children {[c.pid for c in driver.children(recursive=True)]}")
        print(f"status: {st}")
        if st.log_path:
            print(Path(st.log_path).read_text(errors="replace")[-6000:])
        raise


def _processed(service) -> int:
    st = service.version_status(JOB, "v1")
    return sum(o for ps in st.processed_offsets.values() for o in ps.values())


def test_a_stateful_stream_job_survives_postgres_and_driver_kills_while_a_producer_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.dev import stack as dev_stack

    # KAPPA_CHAOS_SEED replays a printed seed's choices (the timing still varies).
    seed = int(os.environ.get("KAPPA_CHAOS_SEED") or random.randrange(1 << 30))
    print(f"chaos seed {seed}")
    rng = random.Random(seed)
    with own_stack("kappa-chaos-stream-") as stack:
        settings = replace(stack.settings, max_batch_records=3_000, chunk_records=1_500,
                           live_trigger_seconds=0.5)
        from orchestrator.service import Orchestrator

        service = Orchestrator(settings)
        topic = "pageviews"
        service.produce_sample(topic, FIRST, seed=seed % 1000, users=300)
        service.deploy(example(tmp_path, "url_visitors", {"pageviews": topic}))
        env = dict(os.environ, **settings.driver_environment())
        producer = subprocess.Popen(
            [str(Path(sys.executable).with_name("kappa")), "produce-sample", "--topic", topic,
             "--count", str(PRODUCED), "--seed", str(seed % 1000 + 1), "--users", "300",
             "--rate", "800"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Two postmaster kills, and a driver kill followed by a death at a fail point (six
            # rounds found nothing that four did not, at two more starts). A driver kill with a
            # clean restart after it is made by test_stream_jobs' examples, on each replay.
            actions = ["postgres", "postgres", "fail_point"]
            rng.shuffle(actions)
            for round_, action in enumerate(actions):
                # A random moment: some progress since the last round, 1 to 2,000 records (at
                # most the whole log: the producer may be done).
                target = min(TOTAL, _processed(service) + rng.randint(1, 2_000))
                try:
                    wait_until(lambda t=target: _processed(service) >= t, 600,
                               f"round {round_}: progress to {target} before the {action} "
                               "kill", poll_s=0.25)
                except AssertionError:
                    st = service.version_status(JOB, "v1")
                    print(f"status: {st}")
                    if st.log_path:
                        print(Path(st.log_path).read_text(errors="replace")[-6000:])
                    raise
                print(f"round {round_}: {action} at {target}")
                if action == "postgres":
                    pid = dev_stack.status(stack.state).postgres.pid
                    assert pid
                    os.kill(pid, signal.SIGKILL)
                    wait_until(lambda: not dev_stack.status(stack.state).postgres.running, 30,
                               "PostgreSQL to be gone")
                    dev_stack.up(stack.state)
                    continue
                driver = service.version_status(JOB, "v1").pid
                assert driver
                # A SIGKILL, and the next driver exits at a fail point between the two commits.
                point = rng.choice(POINTS)
                os.killpg(driver, signal.SIGKILL)
                _wait_for_death(service, driver, "SIGKILL", 60)
                wait_until(lambda: service.version_status(JOB, "v1").state.value
                           == "failed", 60, "the dead driver to be noticed")
                monkeypatch.setenv("KAPPA_FAIL_POINTS", f"{point}={rng.randint(1, 4)}*off->1*exit")
                service.restart(JOB, "v1")
                monkeypatch.delenv("KAPPA_FAIL_POINTS")
                driver = service.version_status(JOB, "v1").pid
                # After a fail point's restart, a cold driver starts and runs up to five batches
                # first: in CI's first minutes (the JDK's class archive still building, both
                # cores taken) that took more than 120 s once, eight times this test's time alone.
                _wait_for_death(service, driver, action, 600)
                wait_until(lambda: service.version_status(JOB, "v1").state.value == "failed",
                           60, "the dead driver to be noticed")
                service.restart(JOB, "v1")
            assert producer.wait(180) == 0
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        st = service.wait(JOB, "v1", timeout_s=600)
        # One attempt per driver death: the kill and the death at a fail point.
        deaths = 2 * actions.count("fail_point")
        assert st.state.value == "live" and st.attempt == 1 + deaths
        reference = url_visitors(Log(read_records(settings.kafka_bootstrap, topic), []))
        assert reference
        assert table(settings, "url_visitors__v1", "url", COLUMNS) == reference

