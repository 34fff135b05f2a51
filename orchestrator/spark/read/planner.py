"""One read planner: how a batch's offsets of one topic are cut into read tasks, and which
segments of the archive serve each, for the streaming source's read tasks (source.py), for the
sink that reads a batch itself (sink_reads.py) and so for a batch phase's tiles (#60).

Each of them once asked the catalog with a cache of its own, and cut the tasks with its own
arguments; "cut the same way" was a convention. Here one view of the archive per topic keeps
what the catalog said, and one function cuts: a batch read again, by either reader, is cut
the same way and reads each offset once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.archive.coverage import ReadTask, read_tasks
from orchestrator.lag import chunk_size

# Segments never change once recorded, so what was read of the catalog stays true; it is
# asked again after this long only for what was archived since.
RECHECK_S = 10.0

Offsets = Mapping[str, Mapping[str, int]]


class ArchiveView:
    """What the archive holds of one topic of the log a version reads: its segments by
    partition, and which of them are decoded under the source's decoding (none where the
    source reads no decoded segment)."""

    def __init__(self, catalog_schema: str, topic: str, root: str | None,
                 identity_json: str | None, decoding: str | None):
        self.catalog_schema, self.topic, self.root = catalog_schema, topic, root
        self.identity, self.decoding = identity_json, decoding  # decoding: a fingerprint
        self._seen: tuple[float, dict[int, list[Any]], dict[str, tuple[str, str]]] | None = None

    def held(self) -> tuple[dict[int, list[Any]], dict[str, tuple[str, str]]]:
        """({partition: segments in offset order}, {raw segment path: (decoded path,
        checksum)}); both empty where the source has no archive."""
        from orchestrator.spark.read.archive_source import archived_segments, decoded_segments

        if self.root is None:
            return {}, {}
        if self._seen is None or time.monotonic() - self._seen[0] > RECHECK_S:
            segments = archived_segments(self.catalog_schema, self.identity, self.topic,
                                         self.root)
            decoded = decoded_segments(self.catalog_schema, segments, self.decoding) \
                if segments and self.decoding is not None else {}
            self._seen = (time.monotonic(), segments, decoded)
        return self._seen[1], self._seen[2]


def plan_reads(view: ArchiveView, start: Offsets, end: Offsets, cores: int, chunk_records: int,
               broker_starts: Callable[[], Mapping[tuple[str, int], int]]) -> list[ReadTask]:
    """The read tasks of [start, end) of ``view``'s topic: every core of the cluster gets
    one, whatever the number of partitions. ``broker_starts`` ({(topic, partition): log
    start}) is asked only where the archive holds something: below the broker's start Kafka
    cannot serve a task's first offsets."""
    topic = view.topic
    mine_start, mine_end = {topic: dict(start.get(topic, {}))}, {topic: dict(end.get(topic, {}))}
    total = sum(stop - mine_start[topic].get(p, stop) for p, stop in mine_end[topic].items())
    if not total:
        return []
    archived, decoded = view.held()
    broker = dict(broker_starts()) if archived else {}
    return read_tasks(mine_start, mine_end, chunk_size(total, cores, chunk_records), archived,
                      decoded, broker)
