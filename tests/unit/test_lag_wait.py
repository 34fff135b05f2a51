"""A plan's switch refused for its version's lag is tried again for a while; any other refusal
fails at once (orchestrator/plan/lag_wait.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator.errors import LagRefusedError, StateError
from orchestrator.plan.lag_wait import switch_when_lag_allows


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _switch(refusals: list[Exception]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def switch() -> str:
        calls.append(1)
        if refusals:
            raise refusals.pop(0)
        return "switched"

    return calls, switch


def test_a_lag_refusal_is_tried_again_and_said() -> None:
    clock, said = _Clock(), list[str]()
    calls, switch = _switch([LagRefusedError("its lag cannot be measured against the log now")])
    assert switch_when_lag_allows(switch, said.append, clock=clock,
                                  sleep=clock.sleep) == "switched"
    assert len(calls) == 2 and clock.now == 2.0
    assert said == ["its lag cannot be measured against the log now; trying again for up to 60 s"]


def test_other_refusals_fail_at_once() -> None:
    clock = _Clock()
    calls, switch = _switch([StateError("it is failed")])
    with pytest.raises(StateError, match="it is failed"):
        switch_when_lag_allows(switch, print, clock=clock, sleep=clock.sleep)
    assert len(calls) == 1 and clock.now == 0.0


def test_a_lag_that_keeps_refusing_fails_after_the_wait() -> None:
    clock = _Clock()
    calls, switch = _switch([LagRefusedError("behind")] * 100)
    with pytest.raises(LagRefusedError):
        switch_when_lag_allows(switch, lambda _: None, wait_s=10, retry_s=3, clock=clock,
                               sleep=clock.sleep)
    assert clock.now == 10.0 and len(calls) == 5  # at 0, 3, 6, 9 and 10 s
