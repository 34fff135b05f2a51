"""The replay queue's arithmetic (pure): priorities, and when each queued version may be done.

A queued version gets the slot that frees first: the running catch-ups free theirs at their
ETAs, and a queued one holds its slot for its own catch-up, estimated at the running catch-ups'
median rate. An unknown figure stays unknown (None) for that version and every one behind it on
the same slot, never a guess."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.errors import ConfigError

LOWEST_PRIORITY, HIGHEST_PRIORITY = -1000, 1000


def parse_priority(raw: str | int) -> int:
    """A replay's priority: an integer from -1000 to 1000, higher replays first."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not LOWEST_PRIORITY <= value <= HIGHEST_PRIORITY:
        raise ConfigError(f"priority {raw!r} is not valid: give an integer from "
                          f"{LOWEST_PRIORITY} to {HIGHEST_PRIORITY} (higher replays first; "
                          "the default is 0)")
    return value


def median_rate(rates: Sequence[float | None]) -> float | None:
    """The running catch-ups' median rate, records/s; None when none was measured."""
    known = [r for r in rates if r is not None and r > 0]
    return statistics.median(known) if known else None


def queue_estimates(running_etas: Sequence[float | None], slots: int | None,
                    queued_records: Sequence[int | None], rate: float | None
                    ) -> list[tuple[float | None, float | None]]:
    """(seconds until a slot, seconds until caught up) of each queued version, in queue order.

    ``running_etas``: the catch-ups holding slots; ``slots``: the budget (None: no budget, so
    nobody waits); ``queued_records``: each queued version's records to replay."""
    if slots is None:
        frees: list[float | None] = [0.0] * len(queued_records)
    else:
        frees = list(running_etas) + [0.0] * max(0, slots - len(running_etas))
    result: list[tuple[float | None, float | None]] = []
    for records in queued_records:
        if not frees:
            result.append((None, None))
            continue
        known = [(t, i) for i, t in enumerate(frees) if t is not None]
        if len(known) < len(frees) and (not known or min(known)[0] > 0):
            # The slot that frees first may be one whose time is unknown.
            wait: float | None = None
            slot = next(i for i, t in enumerate(frees) if t is None)
        else:
            wait, slot = min(known)
        own = None if records is None or rate is None else records / rate
        done = None if wait is None or own is None else wait + own
        frees[slot] = done
        result.append((wait, done))
    return result
