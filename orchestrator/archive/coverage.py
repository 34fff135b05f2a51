"""Which read tasks of a replay the archive serves (pure; no driver library).

A batch's offsets are cut into read tasks as before, whatever the archive holds, so that a
batch read again after a crash is cut the same way; each task whose whole range the archive
holds reads the archive's segments, the others read Kafka. Below the archive's end a replay
reads the archive, and it goes over to Kafka at the first task that reaches past it. A task
that starts below the broker's log start (retention took its first offsets) reads what the
archive holds of it and Kafka the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.archive_model.segments import Segment


@dataclass(frozen=True)
class SegmentRef:
    """What a read task needs of one segment: where it is and what the manifest says of it."""

    path: str  # relative to the archive root
    first_offset: int
    end_offset: int
    records: int
    checksum: str
    # The segment decoded under the reader's decoding (archive_model/decoding.py), if it is yet.
    decoded_path: str | None = None
    decoded_checksum: str | None = None


def with_decoded(refs: tuple[SegmentRef, ...], decoded: dict[str, tuple[str, str]]
                 ) -> tuple[SegmentRef, ...]:
    """``refs``, each with its decoded segment where ``decoded`` ({raw segment path: (decoded
    path, checksum)}) has one: a read task reads those, and parses only the others."""
    return tuple(replace(r, decoded_path=decoded[r.path][0], decoded_checksum=decoded[r.path][1])
                 if r.path in decoded else r for r in refs)


def covering(start: int, end: int, segments: Sequence[Segment]
             ) -> tuple[SegmentRef, ...] | None:
    """The segments that hold all of [start, end), or None when the archive does not.
    ``segments``: one partition's, in offset order, contiguous (the manifest's rule)."""
    if not segments or start < segments[0].first_offset or end > segments[-1].end_offset:
        return None
    return tuple(SegmentRef(s.path, s.first_offset, s.end_offset, s.records, s.checksum)
                 for s in segments if s.first_offset < end and s.end_offset > start)


def covering_from(start: int, end: int, segments: Sequence[Segment]
                  ) -> tuple[tuple[SegmentRef, ...], int] | None:
    """The segments that hold [start, cut), and the cut: ``end``, or the archive's end where it
    ends first. None when the archive does not hold ``start``. For a read task that starts below
    the broker's log start: the archive serves what retention took, Kafka the rest."""
    if not segments or not segments[0].first_offset <= start < segments[-1].end_offset:
        return None
    cut = min(end, segments[-1].end_offset)
    refs = covering(start, cut, segments)
    return (refs, cut) if refs else None


def spans(topic: str, held: dict[int, list[Segment]]) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (first offset, end offset)} of contiguous segments per partition."""
    return {(topic, partition): (segments[0].first_offset, segments[-1].end_offset)
            for partition, segments in held.items() if segments}


@dataclass(frozen=True)
class ReadTask:
    """One read task of a batch: offsets [start, end) of one partition; [start, cut) from the
    archive's ``segments``, the rest from Kafka."""

    topic: str
    partition: int
    start: int
    end: int
    segments: tuple[SegmentRef, ...]
    cut: int

    @property
    def decoded_only(self) -> bool:
        """Whether decoded segments serve all of it."""
        return bool(self.segments) and self.cut == self.end and all(
            r.decoded_path is not None for r in self.segments)


def read_tasks(start: dict[str, dict[str, int]], end: dict[str, dict[str, int]], chunk: int,
               archived: dict[int, list[Segment]], decoded: dict[str, tuple[str, str]],
               broker_starts: dict[tuple[str, int], int]) -> list[ReadTask]:
    """A batch's read tasks: each partition's range cut into chunks of ``chunk`` offsets,
    whatever the archive holds (so that a batch read again is cut the same way); each reads
    the archive where it holds the whole chunk, or (below the broker's log start, where
    retention took the first offsets) where it holds the chunk's start."""
    from orchestrator.lag import split_range

    tasks = []
    for topic, partitions in end.items():
        for partition, stop in partitions.items():
            first = start.get(topic, {}).get(partition, stop)
            held = archived.get(int(partition), [])
            broker_start = broker_starts.get((topic, int(partition)), 0)
            for lo, hi in split_range(first, stop, chunk):
                whole = covering(lo, hi, held)
                part = covering_from(lo, hi, held) if not whole and lo < broker_start \
                    else None
                refs, cut = part if part else (whole or (), hi if whole else lo)
                tasks.append(ReadTask(topic, int(partition), lo, hi,
                                      with_decoded(refs, decoded), cut))
    return tasks
