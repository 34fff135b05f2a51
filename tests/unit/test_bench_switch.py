"""The switch benchmark's limits measured in the same run: the longest reader statement while
switching against the longest in as long again without switches, and the p99 of a few."""

from __future__ import annotations

from bench.switch import longest_begun_in, p99

SPANS = [(0.5, 9.0), (10.0, 0.2), (12.0, 3.0), (19.9, 0.1), (20.0, 7.0), (29.0, 0.4)]


def test_statements_count_in_the_phase_they_began_in() -> None:
    # Switching from 10 s for 10 s, then as long without switches.
    assert longest_begun_in(SPANS, (10.0, 10.0)) == 3.0
    assert longest_begun_in(SPANS, (20.0, 10.0)) == 7.0  # begun at 20 s: not switching's


def test_a_phase_without_statements_or_no_phase_gives_none() -> None:
    assert longest_begun_in(SPANS, (40.0, 5.0)) is None
    assert longest_begun_in(SPANS, None) is None
    assert longest_begun_in([], (0.0, 1.0)) is None


def test_p99_of_fifty_switches_is_the_second_longest() -> None:
    ordered = [float(i) for i in range(50)]
    assert p99(ordered) == 48.0
    assert p99([3.0]) == 3.0
