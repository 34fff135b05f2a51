"""How an archived partition is written back so that every record lands at its own offset.

A fresh topic numbers its records from 0, one offset each, so plain records come back at their
offsets by being produced in order. A gap cannot be produced as such: the only offsets a producer
can make hold no record are a transaction's marker. So a gap of one offset after a record is
made by producing the records before it in a transaction and committing it: the commit marker
takes the gap's offset. Anything else (a gap of several offsets, which aborted records leave
on a broker that hides them, or a gap at the start) has no faithful reproduction on a broker
that shows aborted records to every reader, and is refused, saying where.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from orchestrator.archive_model.segments import ArchivedRecord, ArchiveError

# Records produced in one call, outside transactions: bounds the memory a restore holds.
RUN_RECORDS = 50_000


@dataclass(frozen=True)
class Run:
    """Records with consecutive offsets from ``first_offset``; ``commit_marker``: produce them
    in one transaction, whose marker takes the offset after the last."""

    first_offset: int
    records: tuple[ArchivedRecord, ...]
    commit_marker: bool

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.records) + (1 if self.commit_marker else 0)


def plan_runs(segments: Iterable[tuple[int, int, Sequence[ArchivedRecord], Sequence[int]]],
              where: str, *, run_records: int = RUN_RECORDS) -> Iterator[Run]:
    """Runs that rebuild a partition from ``segments``: (first offset, end offset, records,
    gap offsets) in order, tiling from offset 0. ``where`` names the partition in errors."""
    pending: list[ArchivedRecord] = []
    position = 0
    for first, end, records, gaps in segments:
        if first != position:
            raise ArchiveError(
                f"{where}: the archive starts at offset {first}, not {position}; a new topic "
                "starts at 0, so these offsets cannot be restored. Replay from a broker that "
                "still holds the log instead")
        gap_set = set(gaps)
        by_offset = iter(records)
        for offset in range(first, end):
            if offset in gap_set:
                if not pending:
                    what = "at the start of the log" if offset == 0 else "after another gap"
                    raise ArchiveError(
                        f"{where}: offset {offset} is a gap {what} (aborted or compacted "
                        "records); the embedded broker shows aborted records to every reader, "
                        "so it cannot be rebuilt with the same offsets. Use a real Kafka, or "
                        "replay from a broker that still holds the log")
                yield Run(offset - len(pending), tuple(pending), True)
                pending = []
                continue
            record = next(by_offset)
            if record[0] != offset:
                raise ArchiveError(f"{where}: record at offset {record[0]} where offset {offset} "
                                   "was due: the segment is damaged; run `kappa archive verify`")
            pending.append(record)
            if len(pending) > run_records:
                # All but the last: a marker may follow, and it needs a record in its transaction.
                yield Run(offset - len(pending) + 1, tuple(pending[:-1]), False)
                pending = pending[-1:]
        position = end
    if pending:
        yield Run(position - len(pending), tuple(pending), False)
