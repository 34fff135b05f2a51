"""Live first on real drivers, under `kappa agent`: a live version that falls more than
live_lag_protect_s behind holds the replay queue (a deploy queues), and pauses a running
catch-up (stopped, back in the queue with its reason, an event), which resumes from its
checkpoint once the live version is back under half the limit. Both outputs equal their
references.

The live version falls behind because its driver is frozen (SIGSTOP of its process group): the
lag grows at one second per second whatever the machine's load. The catch-up is held at its
first read (the fail point source.read=pause) until the test lets it go, so it is still
replaying when the pause comes."""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli, wait_until
from integration.helpers import output, stop_drivers
from integration.observability import agent
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
LIMIT_S = 20.0  # it acts at 10 s behind, and lets go under 5 s


class _Producer(threading.Thread):
    """An application writing about 100 page views a second until stopped."""

    def __init__(self, service: object, topic: str) -> None:
        super().__init__(daemon=True)
        self.service, self.topic, self.done = service, topic, threading.Event()

    def run(self) -> None:
        seed = 1000
        while not self.done.is_set():
            self.service.produce_sample(self.topic, 100, seed=seed, rate=100)  # type: ignore[attr-defined]
            seed += 1


def _freeze(service: object, job: str, sig: signal.Signals) -> None:
    pid = service.version_status(job, "v1").pid  # type: ignore[attr-defined]
    assert pid, f"{job} has no driver"
    os.killpg(pid, sig)


def test_a_live_version_behind_holds_the_queue_and_pauses_a_catch_up_that_resumes_exactly(
        settings, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.failpoints import release
    from orchestrator.service import Orchestrator

    settings = replace(settings, live_lag_protect_s=LIMIT_S, replay_slots=2)
    service = Orchestrator(settings)
    backlog = f"{topic}_backlog"
    service.produce_sample(topic, 2_000, seed=51)
    service.produce_sample(backlog, 20_000, seed=52)
    service.deploy(job_file(tmp_path, "v1", topic, name="lf_live"))
    service.wait("lf_live", "v1", timeout_s=240)
    wait_until(lambda: service.version_status("lf_live", "v1").state.value == "live", 60,
               "lf_live to go live")
    producer = _Producer(service, topic)
    producer.start()
    released = tmp_path / "released"
    released.mkdir()
    # Drivers started from here on (by this test or by the agent) stop at their first read.
    monkeypatch.setenv("KAPPA_FAIL_POINTS", "source.read=pause")
    monkeypatch.setenv("KAPPA_FAIL_POINTS_RELEASE", str(released))
    frozen = False
    try:
        with agent(settings, tmp_path, "--interval", "1", "--window", "5"):
            # 1. The live version falls behind: the queue is held, and a deploy queues.
            _freeze(service, "lf_live", signal.SIGSTOP)
            frozen = True
            hold = wait_until(service.replays.hold, 90, "the agent to hold the queue")
            assert "live version lf_live v1 is" in hold.reason, hold
            deployed = service.deploy(job_file(tmp_path, "v1", backlog, name="lf_backlog"))
            assert deployed.status.state.value == "queued", deployed.status
            assert "held by live first: live version lf_live v1" in (deployed.status.reason
                                                                      or "")
            listed = json.loads(kappa_cli(settings, "queue", "--json", check=True).stdout)
            assert "lf_live v1" in listed["hold"]["reason"]
            assert [(e["job"], e["place"]) for e in listed["versions"]] == [("lf_backlog", 1)]

            # 2. It recovers: the hold ends and the agent starts the catch-up.
            _freeze(service, "lf_live", signal.SIGCONT)
            frozen = False
            wait_until(lambda: service.version_status("lf_backlog", "v1").pid, 90,
                       "the agent to start lf_backlog once the hold ended")
            assert service.replays.hold() is None
            first = service.version_status("lf_backlog", "v1")
            assert first.state.value in ("starting", "replaying")

            # 3. Behind again while the catch-up replays: the catch-up is paused.
            _freeze(service, "lf_live", signal.SIGSTOP)
            frozen = True
            paused = wait_until(lambda: _in_state(service, "lf_backlog", "queued"), 90,
                                "lf_backlog to be paused")
            assert "paused by live first: live version lf_live v1 is" in (paused.reason or "")
            wait_until(lambda: not _alive(first.pid), 30, "the paused driver to exit")

            # 4. Recovered: it resumes from its checkpoint, this time reading through.
            release(released, "source.read")
            _freeze(service, "lf_live", signal.SIGCONT)
            frozen = False
            service.wait("lf_backlog", "v1", timeout_s=300)
        producer.done.set()
        producer.join(60)
        service.wait("lf_live", "v1", timeout_s=120)
    finally:
        producer.done.set()
        if frozen:
            _freeze(service, "lf_live", signal.SIGCONT)
        stop_drivers(service)
    kinds = [e["kind"] for e in reversed(service.events(limit=10_000))
             if e["kind"] in ("replay_hold", "replay_hold_ended", "paused")]
    assert kinds == ["replay_hold", "replay_hold_ended", "replay_hold", "paused",
                     "replay_hold_ended"], kinds
    (pause,) = [e for e in service.events("lf_backlog", "v1") if e["kind"] == "paused"]
    assert "lf_live v1" in pause["detail"]["reason"] and pause["detail"]["attempt"] == 1
    assert service.version_status("lf_backlog", "v1").attempt == 2  # paused once, resumed once
    assert output(settings, "lf_backlog__v1") == compute(settings.kafka_bootstrap, backlog).v1
    assert output(settings, "lf_live__v1") == compute(settings.kafka_bootstrap, topic).v1


def _in_state(service: object, job: str, state: str) -> object:
    status = service.version_status(job, "v1")  # type: ignore[attr-defined]
    return status if status.state.value == state else None


def _alive(pid: int | None) -> bool:
    """Whether the process runs (a zombie the agent has not reaped yet does not)."""
    import psutil

    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
