"""Pure offset arithmetic: ranges, read limits and lag. No driver library here."""

from __future__ import annotations

from collections.abc import Mapping

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
