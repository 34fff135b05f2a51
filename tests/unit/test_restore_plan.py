"""How an archived partition is planned back into a new topic: records in order, a commit
marker for each single gap after a record, and a refusal, saying where, for what no producer
can rebuild at the same offsets."""

from __future__ import annotations

import pytest

from orchestrator.archive_model.restore_plan import Run, plan_runs
from orchestrator.archive_model.segments import ArchiveError


def _records(*offsets: int) -> list:
    return [(o, 1_000 + o, 1, b"k", b"v%d" % o, None) for o in offsets]


def _offsets(runs: list[Run]) -> list[int]:
    """The offsets the runs make: records, then their marker."""
    made = []
    for run in runs:
        made += [r[0] for r in run.records]
        if run.commit_marker:
            made.append(-(run.end_offset - 1))  # a marker, as a negative offset
    return made


def test_plain_records_are_one_run_and_a_single_gap_is_a_commit_marker() -> None:
    segments = [(0, 4, _records(0, 1, 2), [3]), (4, 9, _records(4, 5, 7, 8), [6])]
    runs = list(plan_runs(segments, "t/0"))
    assert [(r.first_offset, r.end_offset, r.commit_marker) for r in runs] == [
        (0, 4, True), (4, 7, True), (7, 9, False)]
    assert _offsets(runs) == [0, 1, 2, -3, 4, 5, -6, 7, 8]


def test_a_marker_at_a_segment_boundary_takes_the_records_before_it() -> None:
    runs = list(plan_runs([(0, 2, _records(0, 1), []), (2, 4, _records(3), [2])], "t/0"))
    assert [(r.first_offset, len(r.records), r.commit_marker) for r in runs] == [
        (0, 2, True), (3, 1, False)]


def test_long_runs_are_cut_but_a_marker_keeps_a_record_in_its_transaction() -> None:
    runs = list(plan_runs([(0, 11, _records(*range(10)), [10])], "t/0", run_records=3))
    assert all(len(r.records) <= 3 for r in runs)
    assert _offsets(runs) == [*range(10), -10]
    assert runs[-1].commit_marker and runs[-1].records


@pytest.mark.parametrize(("segments", "said"), [
    ([(0, 2, _records(1), [0])], "offset 0 is a gap at the start of the log"),
    ([(0, 4, _records(0, 3), [1, 2])], "offset 2 is a gap after another gap"),
    ([(5, 7, _records(5, 6), [])], "the archive starts at offset 5, not 0"),
    ([(0, 2, _records(0, 1), []), (3, 4, _records(3), [])], "starts at offset 3, not 2"),
])
def test_what_cannot_be_rebuilt_is_refused_saying_where(segments: list, said: str) -> None:
    with pytest.raises(ArchiveError, match=said) as caught:
        list(plan_runs(segments, "pageviews/2"))
    assert str(caught.value).startswith("pageviews/2: ")
