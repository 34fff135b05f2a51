"""Where a log-end probe fetches from, highest first: every rung a lower bound of the end
(unless a transaction is open), and no read of a long log from its start."""

from __future__ import annotations

from orchestrator.kafka.offsets import _START_SCAN_LIMIT, candidate_ladder


def test_rungs_go_down_to_the_log_start_of_a_short_log() -> None:
    assert candidate_ladder(0, 0, 900, None) == [900, 0]
    assert candidate_ladder(10, 500, 900, 700) == [900, 700, 10]


def test_a_long_log_is_never_read_from_its_start() -> None:
    far = _START_SCAN_LIMIT + 100
    assert candidate_ladder(0, 0, far, None) == [far]
    assert candidate_ladder(5, far, far + 9, None) == [far + 9, far]
    assert candidate_ladder(0, 0, far + 50, far) == [far + 50, far]


def test_a_log_whose_candidates_are_its_start_has_one_rung() -> None:
    assert candidate_ladder(42, 0, 0, None) == [42]
