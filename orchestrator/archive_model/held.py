"""The log a version can read: what the broker holds, reaching down below its log start where
the archive holds the same lineage's offsets (pure; no driver library).

Retention takes a partition's oldest records from the broker; the archive keeps them. Where a
partition's archive starts below the broker's log start and reaches up to it, every offset from
the archive's first on is still readable, and a replay from there misses nothing. Where the
archive ends below the log start (its archiver was away longer than the retention), the
offsets in between are gone, and the broker's start stands.
"""

from __future__ import annotations

from collections.abc import Mapping

Position = tuple[str, int]  # topic, partition
Bounds = Mapping[Position, tuple[int, int]]  # first offset, end offset (exclusive)


def readable_bounds(broker: Bounds, archived: Bounds) -> dict[Position, tuple[int, int]]:
    """``broker``'s bounds with each partition's start lowered to the archive's first offset
    where the archive reaches from below the broker's start up to it."""
    out: dict[Position, tuple[int, int]] = {}
    for key, (start, end) in broker.items():
        span = archived.get(key)
        out[key] = (span[0], end) if span and span[0] < start <= span[1] else (start, end)
    return out


def archive_falls_short(broker: Bounds, archived: Bounds) -> str:
    """Why the archive cannot stand in for what retention took, for a refusal's message: the
    partitions whose archive ends below the broker's start ('' when none)."""
    short = [f"{topic}/{partition} ends at {archived[(topic, partition)][1]} below the log "
             f"start {start}"
             for (topic, partition), (start, _) in sorted(broker.items())
             if (topic, partition) in archived and start > archived[(topic, partition)][1]]
    if not short:
        return ""
    return ("; the archive of " + ", ".join(short)
            + " (its archiver was away longer than the retention)")

