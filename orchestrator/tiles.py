"""The tiles of a batch phase (#60): a batch job's catch-up over decoded segments, run as plain
Spark batch jobs, each tile one catalog batch. Pure offset arithmetic; no driver library here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.lag import take_records, total_records
from orchestrator.models import Offsets

# Lag rates are measured over a 30 s window (lag.Thresholds.window_s): a tile that takes a
# third of it leaves the window several commits to measure, so the ETA stays honest.
TILE_TARGET_S = 10.0

Bounds = Mapping[tuple[str, int], tuple[int, int]]


@dataclass(frozen=True)
class Tile:
    batch_id: int
    start: Offsets
    end: Offsets

    @property
    def records(self) -> int:
        return total_records(self.start, self.end)


def side(bounds: Bounds, which: int) -> Offsets:
    """One side of ``bounds`` (0: log starts, 1: log ends) as offsets."""
    out: Offsets = {}
    for (topic, partition), pair in bounds.items():
        out.setdefault(topic, {})[str(partition)] = pair[which]
    return out


def next_tile(batch_id: int, start: Offsets, bounds: Bounds, records: int) -> Tile:
    """The tile from ``start`` of at most ``records`` records, shared across partitions as a
    micro-batch's are (take_records); a partition ``start`` does not know enters at its log
    start, with no records."""
    return Tile(batch_id, start, take_records(start, side(bounds, 1), records, side(bounds, 0)))


def past_the_log_end(ends: Offsets, bounds: Bounds) -> dict[str, tuple[int, int]]:
    """{"topic/partition": (planned end, log end)} where a plan's ``ends`` lie past what the
    log now holds (a broker restored shorter): such a plan can never be read."""
    return {f"{t}/{p}": (end, bounds[(t, int(p))][1])
            for t, ps in ends.items() for p, end in ps.items()
            if (t, int(p)) in bounds and end > bounds[(t, int(p))][1]}


def next_tile_records(records: int, seconds: float, *, least: int, most: int) -> int:
    """The next tile's size from the last one's rate: about TILE_TARGET_S of work, between
    ``least`` and ``most``; ``most`` before any tile was timed."""
    if records <= 0 or seconds <= 0:
        return most
    return max(least, min(most, int(records / seconds * TILE_TARGET_S)))
