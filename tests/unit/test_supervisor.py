"""The agent's restart policy, with a stand-in for the service: pure logic."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace

from orchestrator.errors import KappaError
from orchestrator.observe.supervisor import HEALTHY_AFTER_S, MAX_DELAY_S, Supervisor


@dataclass
class FakeService:
    crashed: list[tuple[str, str, int, str]] = field(default_factory=list)
    restarts: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, dict]] = field(default_factory=list)
    refuse: bool = False

    def crashed_drivers(self) -> list[tuple[str, str, int, str]]:
        return list(self.crashed)

    def restart(self, job: str, version: str) -> SimpleNamespace:
        if self.refuse:
            raise KappaError("the catalog is down")
        self.restarts.append((job, version))
        return SimpleNamespace(attempt=len(self.restarts) + 1)

    def record_event(self, kind: str, job: str, version: str, **detail: object) -> None:
        self.events.append((kind, detail))


def test_a_crashed_driver_is_restarted_at_once_then_with_a_doubling_pause() -> None:
    now = [0.0]
    service = FakeService(crashed=[("j", "v1", 1, "driver process 42 is gone")])
    supervisor = Supervisor(service, clock=lambda: now[0])
    assert supervisor.tick() == [("j", "v1")]
    times = [0.0]
    while now[0] < 2000:
        now[0] += 0.5
        if supervisor.tick():
            times.append(now[0])
    pauses = [b - a for a, b in itertools.pairwise(times)]
    assert pauses[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert max(pauses) == MAX_DELAY_S
    kind, detail = service.events[0]
    assert kind == "agent_restart" and detail["reason"] == "driver process 42 is gone"


def test_a_driver_that_stayed_up_starts_over_at_no_pause() -> None:
    now = [0.0]
    service = FakeService(crashed=[("j", "v1", 1, "driver process 42 is gone")])
    supervisor = Supervisor(service, clock=lambda: now[0])
    supervisor.tick()
    now[0] = 3.0
    supervisor.tick()  # second restart, after 2 s
    now[0] = 3.0 + HEALTHY_AFTER_S + 1
    assert supervisor.tick() == [("j", "v1")]
    now[0] += 0.5
    assert supervisor.tick() == []  # the next pause is 2 s again


def test_nothing_crashed_nothing_restarted_and_a_refused_restart_waits_too() -> None:
    now = [0.0]
    service = FakeService()
    supervisor = Supervisor(service, clock=lambda: now[0])
    assert supervisor.tick() == []
    service.crashed = [("j", "v1", 1, "driver process 42 is gone")]
    service.refuse = True
    assert supervisor.tick() == []
    service.refuse = False
    now[0] = 1.0
    assert supervisor.tick() == []  # within the 2 s pause after the failed try
    now[0] = 2.5
    assert supervisor.tick() == [("j", "v1")]
