"""The replay budget (replay_slots) on real drivers: never more catch-ups at once than slots,
slots taken by priority then age, a queued version retired leaves the queue, and a process
killed between claiming a slot and launching the driver (the fail point queue.after_claim)
neither loses the version nor starts it twice. A restart takes its turn in the queue too.
Every output equals its reference."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import job_file, kappa_cli
from integration.helpers import output, query, stop_drivers
from reference import compute

pytestmark = [pytest.mark.integration, pytest.mark.spark]
JOBS = ("budget_a", "budget_b", "budget_c")


class _Sampler(threading.Thread):
    """Counts the catch-ups holding a slot every 0.2 s, from a connection of its own."""

    def __init__(self, service: object) -> None:
        super().__init__(daemon=True)
        self.service, self.most, self.samples = service, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            holding, _queued, _slots = self.service.replays.counts()  # type: ignore[attr-defined]
            self.most, self.samples = max(self.most, holding), self.samples + 1


def _started_order(settings: object) -> list[str]:
    rows = query(settings, f"SELECT job FROM {settings.catalog_schema}.events "  # type: ignore[attr-defined]
                           "WHERE kind = 'state' AND detail ->> 'to' = 'starting' ORDER BY id")
    return [r[0] for r in rows]


def test_one_slot_replays_by_priority_then_age_and_a_killed_claim_starts_once(
        settings, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.service import Orchestrator

    settings = replace(settings, replay_slots=1)
    service = Orchestrator(settings)
    sampler = _Sampler(service)
    try:
        service.produce_sample(topic, 20_000, seed=31)
        files = {job: job_file(tmp_path, "v1", topic, name=job) for job in (*JOBS, "budget_d")}
        first = service.deploy(files["budget_a"])
        assert first.status.state.value in ("starting", "replaying")
        sampler.start()
        assert service.deploy(files["budget_b"]).status.state.value == "queued"
        # Younger but of a higher priority: it goes before budget_b.
        third = service.deploy(files["budget_c"], priority=5)
        assert third.status.state.value == "queued"
        assert "waiting for a replay slot (replay_slots=1)" in (third.status.reason or "")
        assert service.deploy(files["budget_d"], priority="-3").status.state.value == "queued"

        listed = json.loads(kappa_cli(settings, "queue", "--json", check=True).stdout)
        assert listed["replay_slots"] == 1
        assert [(e["job"], e["state"], e["place"]) for e in listed["versions"]] == [
            ("budget_a", first.status.state.value, None), ("budget_c", "queued", 1),
            ("budget_b", "queued", 2), ("budget_d", "queued", 3)]
        assert all(e["wait_s"] is None or e["wait_s"] >= 0 for e in listed["versions"])

        # A queued version that is retired leaves the queue, and never starts.
        service.retire("budget_d", "v1")
        assert [e["job"] for e in service.replays.queue()] == ["budget_a", "budget_c",
                                                              "budget_b"]

        # A restart takes its turn, as a deploy does: budget_b, stopped while queued, is queued
        # again by `kappa restart` (it used to start at once, over the budget).
        service.stop("budget_b", "v1")
        restarted = service.restart("budget_b", "v1")
        assert restarted.state.value == "queued", restarted
        assert [e["job"] for e in service.replays.queue()
                if e["place"] is not None] == ["budget_c", "budget_b"]

        # A waiter takes budget_c's slot once budget_a has caught up, then dies before it
        # launches the driver.
        monkeypatch.setenv("KAPPA_FAIL_POINTS", "queue.after_claim=exit")
        killed = kappa_cli(settings, "wait", "budget_c", "v1", "--timeout", "240")
        monkeypatch.delenv("KAPPA_FAIL_POINTS")
        assert killed.returncode == 86, killed.stderr[-2000:]
        claimed = service.version_status("budget_c", "v1")
        assert claimed.state.value in ("starting", "queued") and claimed.pid is None

        for job in ("budget_c", "budget_b"):
            service.wait(job, "v1", timeout_s=300)
    finally:
        sampler.done.set()
        stop_drivers(service)
    assert sampler.samples > 10 and sampler.most == 1
    assert _started_order(settings) == ["budget_a", "budget_c", "budget_c", "budget_b"]
    # budget_c's slot was claimed twice and its driver launched once: by whoever looked next.
    log = Path(service.version_status("budget_c", "v1").log_path or "").read_text()
    assert log.count("=== attempt ") == 1 and "=== attempt 2 starting" in log
    requeued = [e for e in service.events("budget_c", "v1") if e["kind"] == "state"
                and e["detail"].get("to") == "queued"]
    assert len(requeued) == 2 and "died before it launched" in str(requeued[0]["detail"])
    ref = compute(settings.kafka_bootstrap, topic)
    for job in JOBS:
        assert output(settings, f"{job}__v1") == ref.v1, job
    assert service.version_status("budget_d", "v1").state.value == "retired"
