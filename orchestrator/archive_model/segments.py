"""The archive's domain: a segment is one partition's contiguous offset range of one log
lineage, kept as an immutable file, and every offset in it is either a record or a gap.

No driver library here: the checksum, the naming of files and the rules that keep a partition's
segments free of holes and overlaps are plain Python, so that the writer, the restore and the
verifier agree on them.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise

from orchestrator.errors import KappaError
from orchestrator.naming import topic_name_problem

# (offset, timestamp ms, timestamp type, key, value, headers): the timestamp type is librdkafka's
# (0 none, 1 create time, 2 log-append time); headers are [(name, value)] or None.
ArchivedRecord = tuple[int, int, int, bytes | None, bytes | None,
                       list[tuple[str, bytes | None]] | None]
SEGMENT_SUFFIX = ".parquet"
_NAME = re.compile(r"(\d{20})-(\d{20})\.parquet")
_LONG = struct.Struct(">q")
# At risk below this share of the broker's log lying under the archive's end: with time-based
# retention, the last tenth of the retention period is the warning.
AT_RISK_SHARE = 0.1


class RetentionRisk(Enum):
    """Whether the broker's retention can delete records the archive has not copied."""

    OK = "ok"
    AT_RISK = "at_risk"  # under AT_RISK_SHARE of what the broker holds is archived
    LOST = "lost"  # it has: offsets between the archive's end and the log's start are gone


class ArchiveError(KappaError):
    """The archive cannot be written or does not match its manifest: the message names the
    segment and what to run."""


@dataclass(frozen=True)
class Lineage:
    """One log a topic name has stood for: a recreated topic (another id) or another cluster
    starts a new lineage, whose offsets have nothing to do with the old one's."""

    cluster_id: str
    topic: str
    topic_id: str

    def __post_init__(self) -> None:
        problem = topic_name_problem(self.topic)
        if problem is not None:  # the topic is the first component of the archive's paths
            raise ArchiveError(f"{problem}: name an existing topic of the log")

    @property
    def folder(self) -> str:
        # A topic id in standard base64 may hold '/' and '+': as base64url (what Kafka itself
        # prints), it is one path component, which an object store requires.
        safe = self.topic_id.replace("/", "_").replace("+", "-")
        return f"{self.cluster_id}-{safe}"

    def directory(self, partition: int) -> str:
        return f"{self.topic}/{self.folder}/p{partition}"


@dataclass(frozen=True)
class Segment:
    """A manifest row: offsets [first_offset, end_offset) of one partition of one lineage."""

    lineage: Lineage
    partition: int
    first_offset: int
    end_offset: int
    records: int
    gap_offsets: tuple[int, ...]
    bytes: int
    checksum: str
    path: str  # relative to the archive root

    def __post_init__(self) -> None:
        if self.end_offset <= self.first_offset:
            raise ArchiveError(f"segment {self.path}: an empty range [{self.first_offset}, "
                               f"{self.end_offset}) is not a segment")
        if self.records + len(self.gap_offsets) != self.end_offset - self.first_offset:
            raise ArchiveError(
                f"segment {self.path}: {self.records} records and {len(self.gap_offsets)} gaps "
                f"do not account for the {self.end_offset - self.first_offset} offsets of "
                f"[{self.first_offset}, {self.end_offset})")


def segment_name(first_offset: int, end_offset: int) -> str:
    """Zero-padded, so that names sort as offsets do."""
    return f"{first_offset:020d}-{end_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    match = _NAME.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def segment_path(lineage: Lineage, partition: int, first_offset: int, end_offset: int) -> str:
    return f"{lineage.directory(partition)}/{segment_name(first_offset, end_offset)}"


def gap_offsets(first_offset: int, end_offset: int, offsets: Iterable[int]) -> tuple[int, ...]:
    """The offsets of [first_offset, end_offset) that hold no record (transaction markers,
    aborted or compacted records). ``offsets`` must be increasing and inside the range."""
    gaps: list[int] = []
    expected = first_offset
    for offset in offsets:
        if offset < expected or offset >= end_offset:
            raise ArchiveError(f"offset {offset} is out of order or outside [{first_offset}, "
                               f"{end_offset}): the log reader returned it twice or late")
        gaps.extend(range(expected, offset))
        expected = offset + 1
    gaps.extend(range(expected, end_offset))
    return tuple(gaps)


def checksum(records: Iterable[ArchivedRecord]) -> str:
    """SHA-256 over every field of every record, in offset order, each length-prefixed (a
    missing key or value and an empty one differ)."""
    digest = hashlib.sha256()
    update = digest.update
    for offset, timestamp_ms, timestamp_type, key, value, headers in records:
        update(_LONG.pack(offset))
        update(_LONG.pack(timestamp_ms))
        update(_LONG.pack(timestamp_type))
        _field(update, key)
        _field(update, value)
        update(_LONG.pack(-1 if headers is None else len(headers)))
        for name, header_value in headers or ():
            _field(update, name.encode())
            _field(update, header_value)
    return digest.hexdigest()


def _field(update: object, data: bytes | None) -> None:
    update(_LONG.pack(-1 if data is None else len(data)))  # type: ignore[operator]
    if data:
        update(data)  # type: ignore[operator]


def matches_manifest(segment: Segment, records: Sequence[ArchivedRecord]) -> bool:
    """Whether ``records`` (read back from a file or a log) are what the manifest recorded."""
    return len(records) == segment.records and checksum(records) == segment.checksum


def first_difference(expected: Sequence[ArchivedRecord], found: Sequence[ArchivedRecord],
                     default: int) -> int:
    """The offset of the first record where ``found`` differs from ``expected``."""
    return next((a[0] for a, b in zip(expected, found, strict=False) if a != b), default)


def next_offset(segments: Sequence[Segment], log_start: int) -> int:
    """Where the next segment of a partition starts: the end of the last one, or the log start
    for a partition not archived yet."""
    return segments[-1].end_offset if segments else log_start


def check_contiguous(segments: Sequence[Segment]) -> None:
    """Segments of one partition, in order, must tile their range: no hole, no overlap."""
    for before, after in pairwise(segments):
        if after.first_offset != before.end_offset:
            kind = "a hole" if after.first_offset > before.end_offset else "an overlap"
            raise ArchiveError(
                f"{kind} between segments {before.path} and {after.path}: the manifest is "
                "damaged; run `kappa archive verify` and restore the catalog from a backup")


@dataclass(frozen=True)
class PartitionArchive:
    """What `kappa archive status` shows for one partition of one topic. A figure the broker
    could not give is None (unknown), never 0."""

    topic: str
    partition: int
    lineage: str | None  # "<cluster id>-<topic id>"
    current: bool | None  # whether the broker holds this lineage now (None: unknown)
    archived_first: int | None
    archived_end: int | None
    segments: int
    records: int
    gaps: int
    bytes: int
    log_start: int | None
    log_end: int | None
    lag_seconds: float | None = None  # age of the oldest record not archived yet; 0 if none
    # The highest log end the archiver noted (None: none yet). A crash of a volatile broker
    # reports the offsets from archived_end up to here as lost.
    noted_end: int | None = None
    error: str | None = None  # what stops a continuous archiver's passes on this topic

    @property
    def behind(self) -> int | None:
        if self.log_end is None:
            return None
        return self.log_end - (self.archived_end if self.archived_end is not None
                               else self.log_start or 0)

    @property
    def retention_headroom(self) -> int | None:
        """Records that retention may still take from the log's start before it takes one the
        archive lacks; negative once it has. None unless this lineage is the broker's now."""
        if not self.current or self.log_start is None:
            return None
        archived_end = self.archived_end if self.archived_end is not None else self.log_start
        return archived_end - self.log_start

    @property
    def retention_headroom_share(self) -> float | None:
        """The headroom as a share of the records the broker holds (1 when it holds none)."""
        headroom = self.retention_headroom
        if headroom is None or self.log_start is None or self.log_end is None:
            return None
        held = self.log_end - self.log_start
        if held <= 0:  # an empty log: nothing to take, or (below 0) taken already
            return 1.0 if headroom >= 0 else -1.0
        return min(1.0, headroom / held)

    @property
    def retention(self) -> RetentionRisk | None:
        share = self.retention_headroom_share  # below 0 exactly when the headroom is
        if share is None:
            return None
        if share < 0:
            return RetentionRisk.LOST
        return RetentionRisk.AT_RISK if share < AT_RISK_SHARE else RetentionRisk.OK
