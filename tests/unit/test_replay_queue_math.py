"""The replay budget's pure parts: priorities, the queue's estimates, the queued state and the
replay_slots setting."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError, StateError
from orchestrator.replay_queue.order import median_rate, parse_priority, queue_estimates
from orchestrator.settings import Settings, load_settings
from orchestrator.states import RunState, transition


@pytest.mark.parametrize("raw", ["high", "1.5", "", "1001", "-1001", None])
def test_a_priority_that_cannot_be_is_one_line_that_says_what_to_give(raw: object) -> None:
    with pytest.raises(ConfigError, match=r"integer from -1000 to 1000") as caught:
        parse_priority(raw)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_priorities_read_as_integers() -> None:
    assert [parse_priority(p) for p in ("0", "-1000", "1000", 7)] == [0, -1000, 1000, 7]


def test_a_queued_version_waits_for_the_slot_that_frees_first() -> None:
    # Two slots, held by catch-ups done in 10 s and 40 s; three queued at 100 records/s.
    estimates = queue_estimates([10.0, 40.0], 2, [1_000, 500, 2_000], 100.0)
    assert estimates == [(10.0, 20.0), (20.0, 25.0), (25.0, 45.0)]


def test_a_free_slot_means_no_wait() -> None:
    assert queue_estimates([30.0], 2, [100], 10.0) == [(0.0, 10.0)]


def test_no_budget_means_nobody_waits() -> None:
    assert queue_estimates([30.0, 50.0], None, [100, 200], 10.0) == [(0.0, 10.0), (0.0, 20.0)]


def test_an_unknown_figure_stays_unknown_for_everyone_behind_it_on_that_slot() -> None:
    # The only slot's holder has no ETA (not converging): nobody can say when it frees.
    assert queue_estimates([None], 1, [100, 100], 10.0) == [(None, None), (None, None)]
    # No rate measured yet: waits behind known ETAs are known, own durations are not.
    assert queue_estimates([10.0], 1, [100, 100], None) == [(10.0, None), (None, None)]
    # With a second slot whose ETA is known, the unknown one is never assumed to free first.
    assert queue_estimates([None, 5.0], 2, [50], 10.0) == [(None, None)]


def test_more_holders_than_slots_free_a_slot_only_once_enough_are_done() -> None:
    """#61 path 7: after a restart over the budget, or a lowered replay_slots, three catch-ups
    hold two slots. A queued version starts once two of them are done (at 20 s), not when the
    first is (the estimate said 10 s)."""
    assert queue_estimates([10.0, 20.0, 30.0], 2, [100], 10.0) == [(20.0, 30.0)]
    assert queue_estimates([30.0, 10.0, 20.0], 1, [100, 100], 10.0) == [(30.0, 40.0),
                                                                         (40.0, 50.0)]
    # One holder with no ETA among them: when enough are done cannot be said.
    assert queue_estimates([10.0, None, 30.0], 2, [100], 10.0) == [(None, None)]


def test_while_live_first_holds_the_queue_no_wait_is_known() -> None:
    """#61 path 7: while live first holds the queue nothing starts, until the live versions
    are back under their limit, a moment nobody can give: a free slot is no wait then."""
    assert queue_estimates([30.0], 2, [100, 100], 10.0, held=True) == [(None, None)] * 2
    assert queue_estimates([], None, [100], 10.0, held=True) == [(None, None)]


def test_the_median_rate_ignores_what_was_not_measured() -> None:
    assert median_rate([None, 0.0, 100.0, 300.0]) == 200.0
    assert median_rate([None, 0.0]) is None


def test_queued_sits_between_registered_and_starting() -> None:
    assert transition(RunState.REGISTERED, RunState.QUEUED) == RunState.QUEUED
    for target in (RunState.STARTING, RunState.STOPPED, RunState.RETIRED, RunState.FAILED):
        assert transition(RunState.QUEUED, target) == target
    assert transition(RunState.STARTING, RunState.QUEUED) == RunState.QUEUED
    assert not RunState.QUEUED.is_active  # no driver is meant to run: no liveness checks
    with pytest.raises(StateError, match="when a replay slot frees"):
        transition(RunState.QUEUED, RunState.LIVE)


def test_replay_slots_default_to_half_the_cores_and_zero_means_no_budget() -> None:
    assert (Settings().replay_budget or 0) >= 2
    assert Settings(replay_slots=3).replay_budget == 3
    assert Settings(replay_slots=0).replay_budget is None


def test_a_negative_budget_is_refused_when_settings_load(tmp_path) -> None:
    with pytest.raises(ConfigError, match="replay_slots=-1 is negative: give the number"):
        load_settings(env={"KAPPA_REPLAY_SLOTS": "-1"}, cwd=tmp_path)


def test_a_keeper_counts_as_gone_after_three_missed_looks_or_fifteen_seconds() -> None:
    from orchestrator.models import QueueKeeper

    assert QueueKeeper("agent", 5.0, 14.9).keeping
    assert not QueueKeeper("agent", 5.0, 15.1).keeping
    assert QueueKeeper("slow agent", 30.0, 89.0).keeping
    assert not QueueKeeper("slow agent", 30.0, 91.0).keeping
    assert QueueKeeper("stack", 2.0, 14.0).keeping  # a few slow looks are not a death


def test_queue_says_who_hands_out_slots_or_that_nobody_does() -> None:
    from orchestrator.cli.queue import unkept_warning
    from orchestrator.models import QueueKeeper

    assert unkept_warning([QueueKeeper("kappa agent on h (pid 1)", 5.0, 1.0)]) is None
    never = unkept_warning([])
    assert never is not None and "none has looked" in never and "kappa agent" in never
    gone = unkept_warning([QueueKeeper("kappa agent on h (pid 1)", 5.0, 600.0)])
    assert gone is not None and "kappa agent on h (pid 1), 600s ago" in gone
    assert "\n" not in gone
