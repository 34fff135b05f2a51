"""The replay queue's promises in docs/budget.md that no test kept before #61: with N = 2 slots
never more than two catch-ups hold one, whoever looks; ties of priority go by the time a version
joined the queue, not by when it was deployed; `kappa wait` shows each queued version's place;
two looks at once start a version once; a live version that restarts holds no slot; `kappa queue
--json` shows live first's hold and the queue as the service gives it. No JVM
starts: every driver pauses at the fail point driver.start, alive, its run `starting` with its
PID, holding its slot, until the test stops it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import job_file, kappa_cli
from integration.helpers import live_lag, stop_drivers, without_spark

pytestmark = [pytest.mark.integration]


def test_two_slots_hold_two_and_the_queue_goes_by_the_time_each_joined_it(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.states import RunState

    service = without_spark(settings, topic, tmp_path, monkeypatch, "pause", replay_slots=2,
                            live_lag_protect_s=60.0)
    try:
        for name in ("first", "second", "rejoined", "waiting"):
            service.deploy(job_file(tmp_path, "v1", topic, name=name))
        states = {name: service.version_status(name, "v1").state
                  for name in ("first", "second", "rejoined", "waiting")}
        assert states == {"first": RunState.STARTING, "second": RunState.STARTING,
                          "rejoined": RunState.QUEUED, "waiting": RunState.QUEUED}, states
        # Out of the queue and back: it joins again behind "waiting", deployed after it.
        service.stop("rejoined", "v1")
        assert service.restart("rejoined", "v1").state == RunState.QUEUED
        # Whoever looks hands out no third slot: both holders' drivers live.
        assert service.replays.schedule() == []
        assert service.replays.counts() == (2, 2, 2)
        listed = [(e["job"], e["state"], e["place"]) for e in service.replays.queue()]
        assert listed[2:] == [("waiting", "queued", 1), ("rejoined", "queued", 2)], listed
        assert sorted(listed[:2]) == [("first", "starting", None), ("second", "starting", None)]
        for name, place in (("waiting", 1), ("rejoined", 2)):
            assert f"place {place} of 2 in the replay queue" in _waited(service, name), name
        # Nobody hands slots out at a steady interval here: `kappa status` says so, on stderr
        # beside --json, whose stdout stays the statuses.
        shown = kappa_cli(service.settings, "status", "--json", check=True)
        assert len(json.loads(shown.stdout)) == 4
        assert "nobody hands out replay slots" in shown.stderr, shown.stderr

        # A holder gone: its slot goes to the one that joined first.
        service.stop("first", "v1")
        assert service.replays.schedule() == [("waiting", "v1")]
        assert service.version_status("rejoined", "v1").state == RunState.QUEUED
        assert service.replays.counts() == (2, 1, 2)

        # Live first's hold, as `kappa queue --json` shows it.
        assert service.replays.protect_live([live_lag("live_one", 99.0)], 60.0)
        listed_json = json.loads(kappa_cli(service.settings, "queue", "--json",
                                           check=True).stdout)
        assert listed_json["hold"]["reason"].startswith(
            "live version live_one v1 is 99.0s behind"), listed_json["hold"]
        assert listed_json["hold"]["since"], listed_json["hold"]
        assert listed_json["replay_slots"] == 2 and listed_json["versions"]
        assert [(e["job"], e["state"], e["place"], e["wait_s"], e["eta_s"])
                for e in listed_json["versions"]] == [
            (e["job"], e["state"], e["place"], e["wait_s"], e["eta_s"])
            for e in service.replays.queue()]
    finally:
        stop_drivers(service)


def _waited(service: Any, name: str) -> str:
    """What `kappa wait` (and `kappa deploy --wait`) shows of a queued version at its first
    look."""
    from orchestrator.errors import KappaError

    seen: list[str] = []
    with pytest.raises(KappaError, match="has not caught up"):
        service.wait(name, "v1", timeout_s=0, poll_s=0.1,
                     progress=lambda status: seen.append(f"{status.state}: {status.reason}"))
    return seen[0]


def test_two_looks_at_once_start_a_queued_version_once(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent, `kappa queue keep` and a waiting `kappa wait` may look at the queue at the
    same instant: a catalog lock makes them take turns, so one of them starts the version and
    the other finds nothing to start. The fail point queue.claiming holds a look between its
    reading of the queue and its claim, long enough for the other look to arrive."""
    import threading

    from orchestrator.failpoints import ENV
    from orchestrator.states import RunState

    service = without_spark(settings, topic, tmp_path, monkeypatch, "pause", replay_slots=1)
    try:
        service.deploy(job_file(tmp_path, "v1", topic, name="holder"))
        assert service.deploy(job_file(tmp_path, "v1", topic, name="raced")).status.state \
            == RunState.QUEUED
        service.stop("holder", "v1")  # its slot is free; nobody has looked yet
        monkeypatch.setenv(ENV, "driver.start=pause;queue.claiming=sleep(400)")
        both = threading.Barrier(2)
        started: list[object] = []

        def look() -> None:
            both.wait()
            try:
                started.append(service.replays.schedule())
            except Exception as exc:  # what a look without its turn would meet
                started.append(exc)

        looks = [threading.Thread(target=look) for _ in range(2)]
        for thread in looks:
            thread.start()
        for thread in looks:
            thread.join(timeout=60)
        assert sorted(map(repr, started)) == ["[('raced', 'v1')]", "[]"], started
        raced = service.version_status("raced", "v1")
        assert raced.state == RunState.STARTING and raced.attempt == 1, raced
        slots = [e for e in service.events("raced", "v1") if e["kind"] == "replay_slot"]
        assert len(slots) == 1, slots
    finally:
        stop_drivers(service)


def test_a_live_version_that_restarts_holds_no_slot(
        settings: object, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/budget.md: a slot is held by a catch-up that has never caught up; a live version
    that restarts reads only its backlog, starts at once and holds none. Its driver records
    replaying, caught_up and live here as it would (the driver as a process elsewhere runs,
    no JVM), and its restart pauses at driver.start."""
    from orchestrator.spark.driver import Driver
    from orchestrator.states import RunState

    service = without_spark(settings, topic, tmp_path, monkeypatch, "pause", replay_slots=1)
    try:
        attempt = service.deploy(job_file(tmp_path, "v1", topic, name="served")).status.attempt
        driver = Driver(service.settings, "served", "v1", attempt)
        try:
            driver.set_state(RunState.REPLAYING)
            driver.set_state(RunState.CAUGHT_UP, RunState.LIVE)
        finally:
            driver.conn.close()
            driver.log_clients.close()
        stop_drivers(service)
        restarted = service.restart("served", "v1")
        assert restarted.state == RunState.STARTING and restarted.attempt == attempt + 1
        # The one slot is free: a catch-up deployed now starts.
        caught = service.deploy(job_file(tmp_path, "v1", topic, name="catching")).status
        assert caught.state == RunState.STARTING, caught
        assert service.replays.counts() == (1, 0, 1)
    finally:
        stop_drivers(service)
