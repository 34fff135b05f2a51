"""The switch benchmark's split of reader statements into those a switch overlapped and the
rest: the figure that says whether switches lengthen readers' statements."""

from __future__ import annotations

from bench.switch import p99, split_by_overlap

SWITCHES = [(10.0, 1.0), (20.0, 0.5), (30.0, 2.0)]  # [10, 11), [20, 20.5), [30, 32)


def test_a_statement_overlapping_any_part_of_a_switch_counts_as_during() -> None:
    spans = [
        (9.0, 1.5),    # runs into the first switch
        (10.2, 0.1),   # inside it
        (10.9, 5.0),   # starts inside it, ends after
        (19.0, 20.0),  # covers the last two switches
        (31.9, 0.5),   # starts in the last
    ]
    during, outside = split_by_overlap(spans, SWITCHES)
    assert during == [1.5, 0.1, 5.0, 20.0, 0.5]
    assert outside == []


def test_statements_between_before_and_after_switches_count_as_outside() -> None:
    spans = [
        (0.0, 9.0),    # ends before the first switch starts
        (9.0, 1.0),    # ends exactly as it starts
        (11.0, 8.99),  # from the first switch's end to just before the second
        (20.5, 9.5),   # from the second's end to the third's start
        (32.0, 1.0),   # after the last
    ]
    during, outside = split_by_overlap(spans, SWITCHES)
    assert during == []
    assert outside == [9.0, 1.0, 8.99, 9.5, 1.0]


def test_unordered_switch_windows_are_sorted_first() -> None:
    during, outside = split_by_overlap([(20.1, 0.1), (25.0, 1.0)], list(reversed(SWITCHES)))
    assert (during, outside) == ([0.1], [1.0])


def test_p99_of_fifty_switches_is_the_second_longest() -> None:
    ordered = [float(i) for i in range(50)]
    assert p99(ordered) == 48.0
    assert p99([3.0]) == 3.0
