"""The ack ledger: the end offset of every partition as far as the embedded broker has
acknowledged it, kept on disk so that it outlives a crash of the broker.

The embedded default's broker keeps its log in memory; what it acknowledged and the archiver
had not yet written is lost with it. The stack's ack proxy notes each acknowledged end here, and
makes it durable, before the producer hears of the acknowledgement. So after a crash, every
record a producer was told is safe is either in the archive or named, by offset, as lost.

The file is a list of lines, appended and synced in groups: ``end <partition> <end> <topic>``,
and ``deleted-id <epoch ms> <topic id> <topic>`` when a client deleted the topic (its ends so
far are forgotten; the restore ends the archive's lineage of that topic id, so that a deletion
the archiver had no pass to see is not undone). A deletion whose id the proxy could not read
is ``deleted <epoch ms> <topic>``: the restore then ends the lineages of the topic met before
that moment (archive_model/deletion.py). Older ledgers say ``forget <topic>``: the ends are
forgotten, with no moment. A line cut off by a crash is ignored: its
acknowledgement was never sent. When the file grows past a bound it is rewritten as the
deletions and ends it holds.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.archive_model.deletion import Deletion

Ends = dict[str, dict[int, int]]  # topic -> partition -> end offset
Deletions = dict[str, Deletion]  # topic -> its deletions by clients (when, which ids)
COMPACT_AFTER_BYTES = 4 << 20


def read_ledger(path: Path) -> Ends:
    """The ends a ledger holds; nothing for a file that does not exist."""
    return _read(path)[0]


def read_deletions(path: Path) -> Deletions:
    """The topics a ledger saw deleted: when, and which topic ids."""
    return _read(path)[1]


def _read(path: Path) -> tuple[Ends, Deletions]:
    ends: Ends = {}
    deletions: Deletions = {}
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return ends, deletions
    lines = text.split("\n")
    for line in lines[:-1]:  # the last is empty, or cut off before its acknowledgement
        kind, _, rest = line.partition(" ")
        if kind == "forget":
            ends.pop(rest, None)
        elif kind in ("deleted", "deleted-id"):
            at, rest = rest.split(" ", 1)
            topic_id, topic = rest.split(" ", 1) if kind == "deleted-id" else (None, rest)
            ends.pop(topic, None)
            _note(deletions, topic, Deletion.noted(int(at), topic_id))
        elif kind == "end":
            partition, end, topic = rest.split(" ", 2)
            noted = ends.setdefault(topic, {})
            noted[int(partition)] = max(noted.get(int(partition), 0), int(end))
    return ends, deletions


def _note(deletions: Deletions, topic: str, deletion: Deletion) -> None:
    before = deletions.get(topic)
    deletions[topic] = deletion if before is None else before.and_then(deletion)


def _deletion_lines(topic: str, deletion: Deletion) -> list[str]:
    lines = [f"deleted-id {deletion.at_ms} {i} {topic}\n" for i in sorted(deletion.topic_ids)]
    return lines + ([f"deleted {deletion.at_ms} {topic}\n"] if deletion.unidentified else [])


def as_lines(ends: Ends, deletions: Deletions | None = None) -> str:
    """A ledger holding just ``deletions`` and ``ends``: the deletions first, since a deletion
    forgets the ends before it."""
    return "".join([*(line for t, d in sorted((deletions or {}).items())
                      for line in _deletion_lines(t, d)),
                    *(f"end {p} {e} {t}\n" for t, partitions in sorted(ends.items())
                      for p, e in sorted(partitions.items()))])


def merge(*ledgers: Ends) -> Ends:
    merged: Ends = {}
    for ends in ledgers:
        for topic, partitions in ends.items():
            into = merged.setdefault(topic, {})
            for partition, end in partitions.items():
                into[partition] = max(into.get(partition, 0), end)
    return merged


def merged(older: Path, newer: Path) -> str:
    """The text of one ledger holding two: each end at its highest, each deletion at its
    latest (a lost broker's ledger that a failed restore left, and the next broker's)."""
    deletions = dict(read_deletions(older))
    for topic, deletion in read_deletions(newer).items():
        _note(deletions, topic, deletion)
    return as_lines(merge(read_ledger(older), read_ledger(newer)), deletions)


class AckLedger:
    """The writer's side: note ends, then sync them before any acknowledgement goes out."""

    def __init__(self, path: Path):
        self.path = path
        self.ends, self.deletions = _read(path)
        self._pending: list[str] = []
        self._file = path.open("ab")

    def note(self, topic: str, partition: int, end: int) -> None:
        # Lower ends arrive too: responses on several connections are not seen in the order
        # the broker appended their batches.
        noted = self.ends.setdefault(topic, {})
        if end > noted.get(partition, 0):
            noted[partition] = end
            self._pending.append(f"end {partition} {end} {topic}\n")

    def forget(self, topic: str) -> None:
        if self.ends.pop(topic, None) is not None:
            self._pending.append(f"forget {topic}\n")

    def deleted(self, topic: str, at_ms: int, topic_id: str | None = None) -> None:
        """A client deleted ``topic``, whose id was ``topic_id`` (None: unknown)."""
        self.ends.pop(topic, None)
        deletion = Deletion.noted(at_ms, topic_id)
        _note(self.deletions, topic, deletion)
        self._pending.extend(_deletion_lines(topic, deletion))

    def take(self) -> tuple[str, str | None]:
        """The lines noted since the last take, and the whole ledger's lines when the file is
        due to be rewritten (called on the thread that notes, so nothing is noted meanwhile)."""
        lines, self._pending = "".join(self._pending), []
        snapshot = None
        if self._file.tell() > COMPACT_AFTER_BYTES:
            snapshot = as_lines(self.ends, self.deletions)
        return lines, snapshot

    def write(self, lines: str, snapshot: str | None = None) -> None:
        """Append and fsync what take() gave (blocking: run it off the event loop)."""
        if lines:
            self._file.write(lines.encode())
            self._file.flush()
            os.fsync(self._file.fileno())
        if snapshot is not None:
            self._rewrite(snapshot)

    def _rewrite(self, snapshot: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.write(snapshot.encode())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._file.close()
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.close()
