"""One read planner (spark/read/planner.py, #60 item 3): the streaming source's read tasks and
the sink's, which a batch phase's tiles use, are cut by one function from one cached view of
the archive. Whatever the archive holds, decoded or not, and wherever the broker's log starts,
a batch's tasks tile each partition's range, each offset in one task, and both readers cut a
batch the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.archive_model.segments import Lineage, Segment
from orchestrator.spark.read import planner
from orchestrator.spark.read.planner import ArchiveView, plan_reads

TOPIC = "t"
LINEAGE = Lineage("cluster", TOPIC, "id")
Held = tuple[dict[int, list[Segment]], dict[str, tuple[str, str]]]


def _options(**extra: str) -> dict[str, str]:
    return {"kafka": json.dumps({"bootstrap": "localhost:9092"}), "topic": TOPIC,
            "group_id": "g", "schema": "url string, duration_ms bigint",
            "non_negative": "[]", "tombstones": "dead_letter", "decoder": "d",
            "start_offsets": "{}", "chunk_records": "7", "cores": "2",
            "max_batch_records": "1000", "version_id": "1", "catalog_schema": "c", "job": "j",
            "version": "v1", "archive_root": "/archive", "decoded": "true",
            "log_identity": "null", **extra}


@st.composite
def archives(draw: st.DrawFn) -> tuple[Held, dict[str, dict[str, int]], dict[str, dict[str, int]],
                                       dict[tuple[str, int], int]]:
    """What the archive holds of up to three partitions (contiguous segments from 0, some
    decoded), a batch [start, end) over them, and the broker's log starts."""
    held: dict[int, list[Segment]] = {}
    decoded: dict[str, tuple[str, str]] = {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    broker: dict[tuple[str, int], int] = {}
    for partition in range(draw(st.integers(1, 3))):
        at, segments = 0, []
        for size in draw(st.lists(st.integers(1, 30), max_size=5)):
            path = f"p{partition}/{at}"
            segments.append(Segment(LINEAGE, partition, at, at + size, size, (), 1, "x", path))
            if draw(st.booleans()):
                decoded[path] = (f"{path}.decoded", "y")
            at += size
        if segments:
            held[partition] = segments
        first = draw(st.integers(0, at + 20))
        start[str(partition)] = first
        end[str(partition)] = first + draw(st.integers(0, 60))
        broker[(TOPIC, partition)] = draw(st.integers(0, at + 20))
    return (held, decoded), {TOPIC: start}, {TOPIC: end}, broker


class _View(ArchiveView):
    """The view with the catalog's answer given: counts how often it is asked."""

    def __init__(self, held: Held):
        super().__init__("c", TOPIC, "/archive", None, "fingerprint")
        self.given, self.asked = held, 0

    def held(self) -> Held:
        self.asked += 1
        return self.given


@given(archives(), st.integers(1, 4), st.integers(1, 40))
def test_a_batchs_read_tasks_tile_each_partition_and_read_each_offset_once(
        archive: Any, cores: int, chunk_records: int) -> None:
    held, start, end, broker = archive
    view = _View(held)
    asked: list[int] = []

    def broker_starts() -> dict[tuple[str, int], int]:
        asked.append(1)
        return broker

    tasks = plan_reads(view, start, end, cores, chunk_records, broker_starts)
    for partition, stop in end[TOPIC].items():
        mine = sorted((t for t in tasks if t.partition == int(partition)), key=lambda t: t.start)
        first = start[TOPIC][partition]
        assert [t.start for t in mine] == [first, *(t.end for t in mine[:-1])][:len(mine)]
        assert (mine[-1].end if mine else first) == stop  # contiguous, each offset once
        for task in mine:
            assert task.start <= task.cut <= task.end and task.start < task.end
            # The archive serves [start, cut) with segments that cover it, in order.
            covered = task.start
            for ref in task.segments:
                assert ref.first_offset <= covered < ref.end_offset
                covered = ref.end_offset
                assert (ref.decoded_path is not None) == (ref.path in held[1])
            assert covered >= task.cut
    total = sum(stop - start[TOPIC][p] for p, stop in end[TOPIC].items())
    assert view.asked == (1 if total else 0)
    assert len(asked) == (1 if total and held[0] else 0)  # the broker only for the archive


def test_the_view_asks_the_catalog_again_only_after_recheck_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.spark.read import archive_source
    from orchestrator.spark.read.source import archive_view

    calls: list[str] = []
    segment = Segment(LINEAGE, 0, 0, 10, 10, (), 1, "x", "p0/0")
    monkeypatch.setattr(archive_source, "archived_segments",
                        lambda *_: calls.append("raw") or {0: [segment]})
    monkeypatch.setattr(archive_source, "decoded_segments",
                        lambda *_: calls.append("decoded") or {"p0/0": ("d", "y")})
    clock = [100.0]
    monkeypatch.setattr(planner.time, "monotonic", lambda: clock[0])
    view = archive_view(_options())
    assert view.held() == ({0: [segment]}, {"p0/0": ("d", "y")})
    clock[0] += planner.RECHECK_S - 1
    view.held()
    assert calls == ["raw", "decoded"]
    clock[0] += 2
    view.held()
    assert calls == ["raw", "decoded"] * 2
    # A source that reads no decoded segment never asks for them; one with no archive, nothing.
    calls.clear()
    archive_view(_options(decoded="")).held()
    archive_view(_options(archive_root="")).held()
    assert calls == ["raw"]


def test_the_source_and_the_sink_cut_a_batch_the_same_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.spark.read.sink_reads import SinkReads
    from orchestrator.spark.read.source import KafkaStreamReader

    segments = [Segment(LINEAGE, 0, at, at + 9, 9, (), 1, "x", f"p0/{at}") for at in (0, 9, 18)]
    held: Held = ({0: segments}, {"p0/0": ("p0/0.d", "y"), "p0/9": ("p0/9.d", "y")})
    monkeypatch.setattr(ArchiveView, "held", lambda self: held)
    start, end = {TOPIC: {"0": 3, "1": 0}}, {TOPIC: {"0": 40, "1": 12}}
    bounds = {(TOPIC, 0): (5, 40), (TOPIC, 1): (0, 12)}  # the broker's (log start, log end)
    source = KafkaStreamReader(_options())
    source._last_bounds = bounds
    by_source = [(r.topic, r.partition, r.start, r.end, r.segments, r.archived_end)
                 for r in source.partitions(start, end)]  # type: ignore[attr-defined]
    sink = SinkReads({TOPIC: _options()}, 2, 7, "c", 1, kafka=None, bounds=lambda _topics: bounds)
    sink.phases = {"catalog": 0.0, "broker": 0.0, "spark": 0.0}
    try:
        by_sink = [(t.topic, t.partition, t.start, t.end, t.segments, t.cut)
                   for t in sink._tasks(TOPIC, _options(), start, end)]
    finally:
        sink.close()
    assert by_source == by_sink
    assert sum(t[3] - t[2] for t in by_sink) == 37 + 12
    assert any(t[4] for t in by_sink) and any(not t[4] for t in by_sink)
