"""Pure offset arithmetic: ranges, read limits and lag. No driver library here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.errors import LogGapError
from orchestrator.models import Offsets


def split_range(start: int, end: int, max_chunk: int) -> list[tuple[int, int]]:
    """Split [start, end) into near-equal chunks of at most ``max_chunk`` offsets."""
    if end <= start:
        return []
    total = end - start
    count = max(1, -(-total // max(1, max_chunk)))
    size, extra = divmod(total, count)
    chunks, lo = [], start
    for i in range(count):
        hi = lo + size + (1 if i < extra else 0)
        chunks.append((lo, hi))
        lo = hi
    return chunks


def take_records(start: Offsets, ends: Offsets, max_records: int | None) -> Offsets:
    """The end offsets of the next batch: all available, or at most ``max_records`` in total,
    shared across partitions in proportion to what each has available."""
    available = {
        (t, p): max(0, end - start.get(t, {}).get(p, end))
        for t, ps in ends.items() for p, end in ps.items()
    }
    result: Offsets = {t: dict(ps) for t, ps in start.items()}
    total = sum(available.values())
    budget = total if max_records is None else min(total, max(0, max_records))
    granted = {k: (n * budget // total if total else 0) for k, n in available.items()}
    # Integer shares can leave a remainder: hand it out so the batch is exactly `budget`.
    remainder = budget - sum(granted.values())
    for key in sorted(available, key=lambda k: available[k] - granted[k], reverse=True):
        if remainder <= 0:
            break
        extra = min(remainder, available[key] - granted[key])
        granted[key] += extra
        remainder -= extra
    for (t, p), n in granted.items():
        first = start.get(t, {}).get(p, ends[t][p])
        result.setdefault(t, {})[p] = first + n
    return result


def lag_records(processed: Offsets, ends: Mapping[tuple[str, int], int]) -> int:
    return sum(
        max(0, end - processed.get(t, {}).get(str(p), 0)) for (t, p), end in ends.items()
    )


def replay_start(bounds: Mapping[tuple[str, int], tuple[int, int]], *, allow_gap: bool
                 ) -> tuple[Offsets, int]:
    """Where a new version starts (each partition's first retained offset) and how many offsets
    retention already removed; refuses a gap unless ``allow_gap``."""
    start: Offsets = {}
    for (topic, partition), (first, _) in sorted(bounds.items()):
        start.setdefault(topic, {})[str(partition)] = first
    gone = sum(first for first, _ in bounds.values())
    if gone and not allow_gap:
        where = ", ".join(f"{t}/{p}: {first}" for (t, p), (first, _) in sorted(bounds.items())
                          if first)
        raise LogGapError(
            f"retention removed {gone} offsets from the start of the log ({where}): the replay "
            "would miss them; deploy with --allow-gap to replay what is left"
        )
    return start, gone


class LagState(StrEnum):
    """How a version is doing against the log, judged from its lag history (like Burrow's
    evaluation rules, but for replays)."""

    CATCHING_UP = "catching_up"
    CAUGHT_UP = "caught_up"
    STALLED = "stalled"
    FALLING_BEHIND = "falling_behind"
    STOPPED = "stopped"


@dataclass(frozen=True)
class LagSample:
    at: float  # seconds since the epoch
    processed: int  # offsets processed, summed over partitions
    log_end: int  # log end offsets, summed over partitions
    lag_seconds: float  # age of the oldest unprocessed record; 0 when caught up
    driver_alive: bool

    @property
    def lag_records(self) -> int:
        return max(0, self.log_end - self.processed)


@dataclass(frozen=True)
class Thresholds:
    window_s: float = 30.0  # longer than a catch-up batch, or every batch looks like a stall
    caught_up_records: int = 0
    caught_up_seconds: float = 5.0


def window(samples: Sequence[LagSample], window_s: float) -> list[LagSample]:
    """The samples of the last ``window_s`` seconds, plus the one just before, so that the
    window's rates span the whole window."""
    if not samples:
        return []
    since = samples[-1].at - window_s
    inside = [s for s in samples if s.at >= since]
    before = [s for s in samples if s.at < since]
    return ([before[-1]] if before else []) + inside


def rates(samples: Sequence[LagSample]) -> tuple[float, float]:
    """(processing rate, produce rate) in records/s between the first and last sample."""
    if len(samples) < 2 or samples[-1].at <= samples[0].at:
        return 0.0, 0.0
    dt = samples[-1].at - samples[0].at
    processing = max(0, samples[-1].processed - samples[0].processed) / dt
    produce = max(0, samples[-1].log_end - samples[0].log_end) / dt
    return processing, produce


def eta_seconds(lag_records: int, processing_rate: float, produce_rate: float) -> float | None:
    """Seconds until caught up at the current rates; None when not converging."""
    if lag_records <= 0:
        return 0.0
    net = processing_rate - produce_rate
    if net <= 0:
        return None
    return lag_records / net


def evaluate(samples: Sequence[LagSample], limits: Thresholds) -> LagState:
    """Judge the latest state from the samples of the last window."""
    if not samples:
        return LagState.CATCHING_UP
    last = samples[-1]
    if not last.driver_alive:
        return LagState.STOPPED
    recent = window(samples, limits.window_s)
    covers = recent[-1].at - recent[0].at >= limits.window_s * 0.99

    def within(s: LagSample) -> bool:
        return (s.lag_records <= limits.caught_up_records
                or s.lag_seconds <= limits.caught_up_seconds)

    if within(last) and (not covers or all(within(s) for s in recent)):
        # A short history that is within limits counts: a fresh version that is done is done.
        return LagState.CAUGHT_UP
    if covers and last.lag_records > 0 and recent[-1].processed == recent[0].processed:
        return LagState.STALLED
    processing, produce = rates(recent)
    if covers and last.lag_records > recent[0].lag_records and processing < produce:
        return LagState.FALLING_BEHIND
    return LagState.CATCHING_UP
