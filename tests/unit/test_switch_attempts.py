"""How a switch asks the broker for lags it has no fresh sample of: it lets the lock go, asks,
and locks again (orchestrator/serving/switch_flow.py). The catalog and the broker are faked
here: what is under test is which versions get asked, and when the switch stops asking."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.routing import Routing
from orchestrator.serving import switch_flow, switch_io
from orchestrator.serving.switch_gates import SwitchFacts, VersionFacts
from orchestrator.states import RunState

MAX_LAG = 100


def _facts(v1_sample: int | None, v2_sample: int | None) -> SwitchFacts:
    """v1 serves every key, v2 is live beside it; each with the lag sample given (None: no
    fresh one)."""
    versions = {
        name: VersionFacts(n, name, RunState.LIVE, None, datetime.now(UTC), None,
                           sample_lag=lag, sample_age_s=None if lag is None else 1.0)
        for n, (name, lag) in enumerate((("v1", v1_sample), ("v2", v2_sample)), 1)}
    return SwitchFacts("job", "job", True, Routing("job", "v1"), ("v1",), versions,
                       deployed={"v1": "v1", "v2": "v2"})  # type: ignore[dict-item]


def _switch(monkeypatch: pytest.MonkeyPatch, reads: Iterator[SwitchFacts],
            broker_lag: dict[str, int | None]) -> tuple[switch_flow.SwitchLag, list[str]]:
    """An A/B step to v2 over the catalog reads given; v2's lag as the gates would judge it,
    and the versions the broker was asked for, in order."""
    asked: list[str] = []

    def measure_now(deployed: str) -> int | None:  # the fake deployed version is its name
        asked.append(deployed)
        return broker_lag[deployed]

    monkeypatch.setattr(switch_io, "switch_transaction", lambda conn: nullcontext())
    monkeypatch.setattr(switch_io, "read_locked", lambda *args, **kwargs: next(reads))
    monkeypatch.setattr(switch_flow, "_switch_locked",
                        lambda board, request, facts, measured: switch_flow._lag(
                            facts, measured, "v2"))
    board: Any = SimpleNamespace(
        s=SimpleNamespace(catalog_schema="kappa", lag_sample_max_age_s=5.0,
                          max_lag_records=MAX_LAG),
        conn=None, measure_now=measure_now)
    request = switch_flow.SwitchRequest("job", "job", "ab", "v2", lambda r: r, "refusing",
                                        force=False, reason=None)
    lag: switch_flow.SwitchLag = switch_flow.run_switch(board, request)  # type: ignore[assignment]
    return lag, asked


def _then_forever(first: SwitchFacts, rest: SwitchFacts) -> Iterator[SwitchFacts]:
    yield first
    while True:
        yield rest


def test_a_sample_that_ages_out_while_the_broker_answers_is_asked_for_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """v2's sample was fresh at the first look and v1 had none; while the broker answered for
    v1 (seconds on a busy host), v2's sample aged out. The switch must ask for v2's lag rather
    than refuse v2 as one whose "lag cannot be measured" (seen in CI)."""
    lag, asked = _switch(monkeypatch, _then_forever(_facts(None, 0), _facts(None, None)),
                         {"v1": 0, "v2": 3})
    assert asked == ["v1", "v2"]
    assert lag == switch_flow.SwitchLag(3, "broker")


def test_each_version_is_asked_for_once_however_often_samples_age_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lag, asked = _switch(monkeypatch, _then_forever(_facts(None, None), _facts(None, None)),
                         {"v1": 0, "v2": 7})
    assert asked == ["v2", "v1"]  # the target first
    assert lag == switch_flow.SwitchLag(7, "broker")


def test_a_target_the_broker_finds_behind_stops_the_asking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lag, asked = _switch(monkeypatch, _then_forever(_facts(None, None), _facts(None, None)),
                         {"v1": 0, "v2": MAX_LAG + 1})
    assert asked == ["v2"]  # the switch is refused: v1's lag does not matter
    assert lag == switch_flow.SwitchLag(MAX_LAG + 1, "broker")
