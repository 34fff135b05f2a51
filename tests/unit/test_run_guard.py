"""The one guard of every change of a run's state (states.Expected): a change decided on a run
applies only to that run, as it was; a driver's own changes only while its run is active."""

from __future__ import annotations

import pytest

from orchestrator.states import Expected, RunState

ACTIVE = [s for s in RunState if s.is_active]
INACTIVE = [s for s in RunState if not s.is_active]


@pytest.mark.parametrize("state", list(RunState))
def test_a_change_decided_on_a_reading_needs_the_same_attempt_and_state(state: RunState) -> None:
    seen = Expected.seen(3, state)
    assert seen.admits(3, state)
    assert not seen.admits(4, state), "a restart took a new attempt since"
    assert not seen.admits(2, state)
    for other in RunState:
        if other != state:
            assert not seen.admits(3, other), f"{state} -> {other} happened since"


def test_a_driver_changes_its_run_only_while_it_is_active_and_its_own() -> None:
    driver = Expected.driver(7)
    assert all(driver.admits(7, state) for state in ACTIVE)
    # Paused back to the queue, stopped, failed or retired from elsewhere: it must stop.
    assert not any(driver.admits(7, state) for state in INACTIVE)
    assert not any(driver.admits(8, state) for state in ACTIVE), "replaced by a restart"
