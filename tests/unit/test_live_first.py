"""Live first's rules (pure): when a live version's lag holds the replay queue, pauses a
catch-up, or lets go."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.replay_queue.live_first import LiveLag, decide
from orchestrator.settings import Settings, load_settings
from orchestrator.states import RunState, transition

LIMIT = 60.0


def _look(*lags: float | None, held: bool = False, since_last_pause_s: float | None = None,
          catching_up: int = 2):
    live = [LiveLag("job", f"v{i}", lag) for i, lag in enumerate(lags)]
    return decide(live, LIMIT, held=held, since_last_pause_s=since_last_pause_s,
                  catching_up=catching_up)


def test_a_live_version_half_way_to_the_limit_holds_the_queue_and_pauses_a_catch_up() -> None:
    # Half way, so that it stays within the limit: the agent sees a lag a sample late, and the
    # live version needs a few seconds to read what piled up.
    decision = _look(5.0, 31.0)
    assert decision.hold and decision.pause
    assert decision.reason(LIMIT) == ("live version job v1 is 31.0s behind "
                                      "(live_lag_protect_s=60)")
    assert not _look(30.0).hold  # at the mark is not past it


def test_one_pause_per_half_limit_while_it_stays_behind() -> None:
    assert not _look(40.0, held=True, since_last_pause_s=10.0).pause  # give it time to show
    assert _look(40.0, held=True, since_last_pause_s=10.0).hold
    assert _look(40.0, held=True, since_last_pause_s=30.0).pause
    assert _look(40.0, held=True, since_last_pause_s=None).pause  # held, nothing paused yet
    assert not _look(40.0, catching_up=0).pause  # nothing to pause: the hold alone
    assert _look(40.0, catching_up=0).hold


def test_the_hold_ends_under_a_quarter_of_the_limit_not_at_the_mark() -> None:
    assert _look(20.0, held=True).hold  # between a quarter and half: it stays
    assert not _look(20.0, held=True).pause
    assert not _look(20.0, held=False).hold  # and does not begin
    assert not _look(15.0, held=True).hold
    assert not _look(14.0, 10.0, held=True).hold


def test_a_lag_that_was_not_measured_decides_nothing() -> None:
    assert _look(None, held=True).hold and not _look(None, held=True).pause
    assert not _look(None, held=False).hold
    assert _look(None, 40.0).pause  # the measured one decides
    assert not decide([], LIMIT, held=True, since_last_pause_s=None, catching_up=1).hold
    assert _look(None).reason(LIMIT) is None


def test_a_paused_catch_up_goes_back_to_the_queue() -> None:
    assert transition(RunState.REPLAYING, RunState.QUEUED) == RunState.QUEUED
    with pytest.raises(Exception, match="cannot go from live to queued"):
        transition(RunState.LIVE, RunState.QUEUED)


def test_the_limit_is_a_setting_and_zero_turns_it_off(tmp_path) -> None:
    assert Settings().live_lag_limit_s == 60.0
    assert Settings(live_lag_protect_s=0).live_lag_limit_s is None
    assert load_settings(env={"KAPPA_LIVE_LAG_PROTECT_S": "12.5"},
                         cwd=tmp_path).live_lag_limit_s == 12.5
    with pytest.raises(ConfigError, match="live_lag_protect_s=-1 is negative: give the seconds"):
        load_settings(env={"KAPPA_LIVE_LAG_PROTECT_S": "-1"}, cwd=tmp_path)
