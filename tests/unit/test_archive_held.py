"""The log a replay can read once retention ran: the broker's, reaching into the archive."""

from __future__ import annotations

import pytest

from orchestrator.archive.coverage import covering_from, spans
from orchestrator.archive_model.held import archive_falls_short, readable_bounds
from orchestrator.archive_model.segments import Lineage, Segment
from orchestrator.errors import LogGapError
from orchestrator.lag import replay_start

LINEAGE = Lineage("c", "pv", "t")


def _segment(first: int, end: int) -> Segment:
    return Segment(LINEAGE, 0, first, end, end - first, (), 1, "x", f"p0/{first}")


def test_the_archive_lowers_a_start_only_where_it_reaches_the_broker_start() -> None:
    broker = {("pv", 0): (500, 900), ("pv", 1): (500, 900), ("pv", 2): (500, 900),
              ("pv", 3): (0, 900)}
    archived = {("pv", 0): (0, 700),  # reaches past the broker's start
                ("pv", 1): (0, 500),  # ends just at it: nothing missing
                ("pv", 2): (0, 499),  # ends below it: offset 499 is gone
                ("pv", 3): (0, 100)}  # the broker holds everything anyway
    assert readable_bounds(broker, archived) == {
        ("pv", 0): (0, 900), ("pv", 1): (0, 900), ("pv", 2): (500, 900), ("pv", 3): (0, 900)}
    assert readable_bounds(broker, {}) == broker
    assert archive_falls_short(broker, archived) == (
        "; the archive of pv/2 ends at 499 below the log start 500 (its archiver was away "
        "longer than the retention)")
    assert archive_falls_short(broker, {("pv", 0): (0, 700)}) == ""


def test_a_new_version_starts_at_zero_when_the_archive_holds_what_retention_took() -> None:
    broker = {("pv", 0): (500, 900), ("pv", 1): (300, 900)}
    start, gone = replay_start(broker, allow_gap=False,
                               archived={("pv", 0): (0, 600), ("pv", 1): (0, 300)})
    assert (start, gone) == ({"pv": {"0": 0, "1": 0}}, 0)
    with pytest.raises(LogGapError) as refused:
        replay_start(broker, allow_gap=False, archived={("pv", 0): (0, 600), ("pv", 1): (0, 299)})
    assert "pv/1: 300" in str(refused.value) and "pv/0" not in str(refused.value).split("(")[1]
    assert "the archive of pv/1 ends at 299 below the log start 300" in str(refused.value)
    assert replay_start(broker, allow_gap=True, archived={("pv", 0): (0, 600)}) == (
        {"pv": {"0": 0, "1": 300}}, 300)


def test_a_task_below_the_broker_start_reads_the_archive_up_to_its_end_then_kafka() -> None:
    held = [_segment(0, 100), _segment(100, 250)]
    refs, cut = covering_from(80, 400, held) or ((), -1)
    assert [r.first_offset for r in refs] == [0, 100] and cut == 250
    refs, cut = covering_from(120, 200, held) or ((), -1)
    assert [r.first_offset for r in refs] == [100] and cut == 200
    assert covering_from(250, 300, held) is None  # the archive holds none of it
    assert covering_from(0, 10, []) is None
    assert spans("pv", {0: held, 1: []}) == {("pv", 0): (0, 250)}
