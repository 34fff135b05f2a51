"""Pure offset arithmetic: ranges, read limits and lag. No driver library here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.archive_model.held import archive_falls_short, readable_bounds
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


# Below this a chunk's fixed cost (a Kafka fetch session, a Python worker round trip) dominates.
MIN_CHUNK_RECORDS = 5_000


def chunk_size(batch_records: int, cores: int, max_chunk: int) -> int:
    """Records per read task: a batch split so that every core gets a task, never more than
    ``max_chunk`` per task (memory), never less than ``MIN_CHUNK_RECORDS`` (overhead)."""
    per_core = -(-max(0, batch_records) // max(1, cores))
    return max(1, min(max_chunk, max(MIN_CHUNK_RECORDS, per_core)))


def take_records(start: Offsets, ends: Offsets, max_records: int | None,
                 log_starts: Offsets | None = None) -> Offsets:
    """The end offsets of the next batch: all available, or at most ``max_records`` in total,
    shared across partitions in proportion to what each has available.

    A partition that ``start`` does not know (one added to the topic after the deploy) first
    enters a batch at its log start, from ``log_starts`` (0 when not given), with no records:
    the next batch reads it from there, and Spark's offset log records where that began, so a
    replay of either batch reads the same offsets."""
    known = {(t, p) for t, ps in start.items() for p in ps}
    available = {
        (t, p): max(0, end - start[t][p])
        for t, ps in ends.items() for p, end in ps.items() if (t, p) in known
    }
    result: Offsets = {t: dict(ps) for t, ps in start.items()}
    for t, ps in ends.items():
        for p, end in ps.items():
            if (t, p) not in known:
                first = (log_starts or {}).get(t, {}).get(p, 0)
                result.setdefault(t, {})[p] = min(first, end)
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
        result[t][p] = start[t][p] + n
    return result


def total_records(start: Offsets, end: Offsets) -> int:
    """The offsets from ``start`` to ``end``; a partition ``start`` does not know adds none."""
    return sum(stop - start.get(t, {}).get(p, stop) for t, ps in end.items()
               for p, stop in ps.items())


def lag_records(processed: Offsets, ends: Mapping[tuple[str, int], int],
                starts: Mapping[tuple[str, int], int] | None = None) -> int:
    """Records between what was processed and the log end; a partition not processed yet
    counts from its log start (``starts``, else 0)."""
    return sum(
        max(0, end - processed.get(t, {}).get(str(p), (starts or {}).get((t, p), 0)))
        for (t, p), end in ends.items()
    )


def lag_against(processed: Offsets, bounds: Mapping[tuple[str, int], tuple[int, int]]) -> int:
    """:func:`lag_records` against {(topic, partition): (log start, log end)}."""
    return lag_records(processed, {k: end for k, (_, end) in bounds.items()},
                       {k: first for k, (first, _) in bounds.items()})


@dataclass(frozen=True)
class LogMismatch:
    """A partition whose log no longer contains the position a version reached."""

    topic: str
    partition: int
    processed: int  # the next offset the version would read
    log_start: int
    log_end: int
    replaced: bool = False  # the topic's id says it is another log, whatever its offsets
    added: bool = False  # a partition the version never read, added to the topic since

    @property
    def recreated(self) -> bool:
        """The log ends below the position, or is another log: the topic was deleted and
        created again (or its partition moved to a broker that lost it)."""
        return self.replaced or self.log_end < self.processed

    def describe(self) -> str:
        where = f"{self.topic}/{self.partition}"
        if self.replaced:
            return (f"{where} is another log now (the topic was deleted and recreated); the "
                    f"version had processed up to {self.processed} of the old one")
        if self.recreated:
            return (f"{where} ends at offset {self.log_end} but the version processed up to "
                    f"{self.processed} (the topic was deleted and recreated)")
        if self.added:
            return (f"{where} was added to the topic and starts at offset {self.log_start}: "
                    f"retention removed {self.log_start} offsets the version never read")
        return (f"{where} starts at offset {self.log_start} but the version processed only up "
                f"to {self.processed} (retention removed {self.log_start - self.processed} "
                "offsets it never read)")


def log_mismatches(processed: Offsets, bounds: Mapping[tuple[str, int], tuple[int, int]]
                   ) -> list[LogMismatch]:
    """Partitions where ``processed`` is outside [log start, log end]: continuing would wait for
    offsets that will never come or skip offsets never read. A partition of a topic the version
    reads that ``processed`` does not know was added since: it is read from offset 0, so a log
    start above 0 is a gap too. A topic the version does not read is no mismatch."""
    out = []
    for (topic, partition), (first, end) in sorted(bounds.items()):
        if topic not in processed:
            continue
        position = processed[topic].get(str(partition))
        if position is None:
            if first > 0:
                out.append(LogMismatch(topic, partition, 0, first, end, added=True))
        elif not first <= position <= end:
            out.append(LogMismatch(topic, partition, position, first, end))
    return out


def log_changed_reason(mismatches: Sequence[LogMismatch], job: str, version: str) -> str:
    return ("the log changed under the version: " + "; ".join(m.describe() for m in mismatches)
            + f". Redeploy under a new VERSION to replay the log as it is now, or run `kappa "
            f"restart --allow-gap {job} {version}` to go on from the log start and record the "
            "gap")


def replay_start(bounds: Mapping[tuple[str, int], tuple[int, int]], *, allow_gap: bool,
                 archived: Mapping[tuple[str, int], tuple[int, int]] | None = None
                 ) -> tuple[Offsets, int]:
    """Where a new version starts (each partition's first readable offset: the broker's, or
    the archive's where it reaches below it) and how many offsets are gone from both; refuses
    a gap unless ``allow_gap``."""
    readable = readable_bounds(bounds, archived or {})
    start: Offsets = {}
    for (topic, partition), (first, _) in sorted(readable.items()):
        start.setdefault(topic, {})[str(partition)] = first
    gone = sum(first for first, _ in readable.values())
    if gone and not allow_gap:
        where = ", ".join(f"{t}/{p}: {first}" for (t, p), (first, _) in sorted(readable.items())
                          if first)
        raise LogGapError(
            f"retention removed {gone} offsets from the start of the log ({where})"
            f"{archive_falls_short(bounds, archived or {})}: the replay would miss them; "
            "deploy with --allow-gap to replay what is left"
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
    LOG_GONE = "log_gone"  # the log it read is gone: no figures against the one there now


@dataclass(frozen=True)
class LagSample:
    at: float  # seconds since the epoch
    processed: int  # offsets processed, summed over partitions
    log_end: int  # log end offsets, summed over partitions
    lag_seconds: float | None  # age of the oldest unprocessed record; 0 when caught up;
    # None when a partition behind had no timestamp to read (unknown, never small)
    driver_alive: bool

    @property
    def lag_records(self) -> int:
        return max(0, self.log_end - self.processed)


@dataclass(frozen=True)
class Thresholds:
    window_s: float = 30.0  # longer than a catch-up batch, or every batch looks like a stall
    caught_up_records: int = 0
    caught_up_seconds: float = 5.0  # counts only within max_lag_records (settings)
    max_lag_records: int = 1000


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
        if s.lag_records <= limits.caught_up_records:
            return True
        # A time lag alone never says caught up: it is unknown when no timestamp was read.
        return (s.lag_records <= limits.max_lag_records and s.lag_seconds is not None
                and s.lag_seconds <= limits.caught_up_seconds)

    if last.lag_records <= limits.caught_up_records or (
            within(last) and (not covers or all(within(s) for s in recent))):
        # Measured at the log end now is caught up, whatever came before; within the limits
        # but not at the end needs a whole window of it. A short history that is within the
        # limits counts: a fresh version that is done is done.
        return LagState.CAUGHT_UP
    if covers and last.lag_records > 0 and recent[-1].processed == recent[0].processed:
        return LagState.STALLED
    processing, produce = rates(recent)
    if covers and last.lag_records > recent[0].lag_records and processing < produce:
        return LagState.FALLING_BEHIND
    return LagState.CATCHING_UP
