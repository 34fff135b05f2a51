from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.lag import LagSample, LagState, Thresholds, eta_seconds, evaluate, rates

LIMITS = Thresholds(window_s=10.0, caught_up_records=0, caught_up_seconds=5.0)


def _series(points: list[tuple[int, int]], lag_s: float = 60.0, step: float = 2.0,
            alive: bool = True) -> list[LagSample]:
    return [LagSample(at=1000 + i * step, processed=p, log_end=e, lag_seconds=lag_s if e > p
                      else 0.0, driver_alive=alive) for i, (p, e) in enumerate(points)]


@given(st.integers(0, 10**9), st.floats(0, 1e7), st.floats(0, 1e7))
def test_eta_is_the_lag_over_the_net_rate_and_none_when_not_converging(
        lag: int, proc: float, prod: float) -> None:
    eta = eta_seconds(lag, proc, prod)
    if lag == 0:
        assert eta == 0.0
    elif proc <= prod:
        assert eta is None
    else:
        # The records behind, drained at what processing gains on producing.
        assert eta == pytest.approx(lag / (proc - prod), rel=1e-9)


def test_eta_of_a_series_follows_its_rates() -> None:
    # 200 records processed and 40 produced every 2 s: 80 records/s gained on the log; the
    # last sample is 2,280 - 1,400 = 880 behind, so 11 s to go.
    series = _series([(i * 200, 2_000 + i * 40) for i in range(8)])
    processing, produce = rates(series)
    assert (processing, produce) == (100.0, 20.0)
    assert series[-1].lag_records == 880
    assert eta_seconds(series[-1].lag_records, processing, produce) == 11.0
    assert eta_seconds(880, 20.0, 100.0) is None  # the same gap, widening


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=0, max_size=20))
def test_rates_are_never_negative(points: list[tuple[int, int]]) -> None:
    processing, produce = rates(_series(points))
    assert processing >= 0 and produce >= 0


def test_caught_up_catching_up_stalled_falling_behind_stopped() -> None:
    assert evaluate(_series([(100, 100)] * 8), LIMITS) is LagState.CAUGHT_UP
    assert evaluate(_series([(i * 10, 100) for i in range(8)]), LIMITS) is LagState.CATCHING_UP
    assert evaluate(_series([(30, 100)] * 8), LIMITS) is LagState.STALLED
    growing = [(i * 10, 100 + i * 30) for i in range(8)]
    assert evaluate(_series(growing), LIMITS) is LagState.FALLING_BEHIND
    assert evaluate(_series([(100, 100)] * 8, alive=False), LIMITS) is LagState.STOPPED


def test_stall_needs_a_whole_window() -> None:
    # Two seconds without progress is not a stall when the window is ten.
    assert evaluate(_series([(30, 100), (30, 100)]), LIMITS) is LagState.CATCHING_UP


def test_small_time_lag_counts_as_caught_up() -> None:
    assert evaluate(_series([(95, 100)] * 8, lag_s=1.0), LIMITS) is LagState.CAUGHT_UP


def test_a_time_lag_alone_never_gives_caught_up() -> None:
    # Seen on the durable stack: 990,000 records behind, "0 s" because no timestamp could be
    # read, judged caught up. The record lag must be within max_lag_records as well.
    behind = [(10_000, 1_000_000)] * 8
    assert evaluate(_series(behind, lag_s=0.0), LIMITS) is not LagState.CAUGHT_UP
    assert evaluate(_series(behind, lag_s=0.0), LIMITS) is LagState.STALLED
    near = Thresholds(window_s=10.0, caught_up_seconds=5.0, max_lag_records=10)
    assert evaluate(_series([(95, 100)] * 8, lag_s=1.0), near) is LagState.CAUGHT_UP
    assert evaluate(_series([(85, 100)] * 8, lag_s=1.0), near) is LagState.STALLED


def test_an_unknown_time_lag_is_not_a_small_one() -> None:
    samples = [LagSample(at=1000 + i * 2.0, processed=95, log_end=100, lag_seconds=None,
                         driver_alive=True) for i in range(8)]
    assert evaluate(samples, LIMITS) is LagState.STALLED
    assert samples[-1].lag_records == 5


def test_at_the_log_end_now_is_caught_up_whatever_came_before() -> None:
    # The demo's replay: far behind a few seconds ago, at the log end now.
    samples = _series([(0, 20_000)] * 4 + [(20_000, 20_000)], lag_s=2.0, step=5.0)
    assert evaluate(samples, Thresholds(window_s=10.0, caught_up_seconds=5.0,
                                        max_lag_records=1_000)) is LagState.CAUGHT_UP
