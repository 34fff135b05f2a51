"""Offset logic for partitions that appear after a deploy and for logs that changed under a
version: pure code, since the embedded broker can neither add partitions nor lose offsets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.lag import lag_records, log_changed_reason, log_mismatches, take_records

PARTITIONS = st.sampled_from(["0", "1", "2", "3", "4", "5"])


@st.composite
def grown_topic(draw: st.DrawFn) -> tuple[dict, dict, dict, int | None]:
    """(start, log starts, log ends, limit): some partitions known to the version, some new."""
    parts = draw(st.dictionaries(PARTITIONS, st.tuples(st.integers(0, 500), st.integers(0, 500),
                                                       st.integers(0, 500)), min_size=1))
    known = draw(st.sets(st.sampled_from(sorted(parts))))
    starts = {"t": {p: first for p, (first, _, _) in parts.items()}}
    ends = {"t": {p: first + a + b for p, (first, a, b) in parts.items()}}
    start = {"t": {p: first + a for p, (first, a, _) in parts.items() if p in known}}
    limit = draw(st.one_of(st.none(), st.integers(0, 2000)))
    return start, starts, ends, limit


@given(grown_topic())
def test_a_new_partition_enters_at_its_log_start_and_is_then_read_whole(case) -> None:
    start, starts, ends, limit = case
    first = take_records(start, ends, limit, starts)
    for p in ends["t"]:
        if p not in start["t"]:
            assert first["t"][p] == starts["t"][p]  # never its log end: nothing is skipped
        else:
            assert start["t"][p] <= first["t"][p] <= ends["t"][p]
    # Batch after batch, every partition is read from where it entered to its end, exactly.
    position, read = first, {p: first["t"][p] - start["t"].get(p, first["t"][p])
                             for p in ends["t"]}
    for _ in range(4000):
        if position == ends:
            break
        nxt = take_records(position, ends, limit if limit else None, starts)
        for p in ends["t"]:
            read[p] += nxt["t"][p] - position["t"][p]
        position = nxt
    assert position == ends
    for p in ends["t"]:
        assert read[p] == ends["t"][p] - start["t"].get(p, starts["t"][p])


@given(grown_topic())
def test_the_lag_counts_a_new_partition_from_its_log_start(case) -> None:
    start, starts, ends, _ = case
    flat_ends = {("t", int(p)): e for p, e in ends["t"].items()}
    flat_starts = {("t", int(p)): s for p, s in starts["t"].items()}
    expected = sum(e - start["t"].get(p, starts["t"][p]) for p, e in ends["t"].items())
    assert lag_records(start, flat_ends, flat_starts) == expected


def test_take_records_of_known_partitions_is_unchanged_by_log_starts() -> None:
    start = {"t": {"0": 5, "1": 7}}
    ends = {"t": {"0": 15, "1": 7}}
    assert take_records(start, ends, 4, {"t": {"0": 0, "1": 0}}) == {"t": {"0": 9, "1": 7}}


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_position_outside_the_log_is_a_mismatch(position: int, first: int, size: int) -> None:
    end = first + size
    found = log_mismatches({"t": {"3": position}}, {("t", 3): (first, end)})
    assert bool(found) == (not first <= position <= end)
    if found:
        (m,) = found
        assert m.recreated == (position > end)
        assert "t/3" in m.describe() and str(position) in m.describe()


def test_a_new_partition_is_read_from_its_first_offset_or_it_is_a_gap() -> None:
    # Added while the version was stopped, and retention has run on it since: starting at its
    # log start would skip 50 offsets unseen, which `deploy` would refuse as a gap.
    (gap,) = log_mismatches({"t": {"0": 10}}, {("t", 0): (0, 10), ("t", 1): (50, 90),
                                               ("t", 2): (0, 7), ("u", 0): (5, 6)})
    assert (gap.topic, gap.partition, gap.processed, gap.log_start) == ("t", 1, 0, 50)
    assert not gap.recreated
    reason = log_changed_reason([gap], "pageview_counts", "v1")
    assert "t/1 was added to the topic" in reason and "retention removed 50" in reason
    assert "kappa restart --allow-gap pageview_counts v1" in reason


def test_the_reason_names_topic_partition_offsets_and_what_to_run() -> None:
    found = log_mismatches({"pv": {"0": 500, "1": 3}}, {("pv", 0): (0, 120), ("pv", 1): (40, 90)})
    reason = log_changed_reason(found, "pageview_counts", "v1")
    assert "pv/0 ends at offset 120" in reason and "processed up to 500" in reason
    assert "recreated" in reason
    assert "pv/1 starts at offset 40" in reason and "retention removed 37" in reason
    assert "kappa restart --allow-gap pageview_counts v1" in reason
