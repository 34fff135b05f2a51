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
                    queued_records: Sequence[int | None], rate: float | None, *,
                    held: bool = False) -> list[tuple[float | None, float | None]]:
    """(seconds until a slot, seconds until caught up) of each queued version, in queue order.

    ``running_etas``: the catch-ups holding slots, which may be more than ``slots`` (after a
    restart over the budget, or a lowered budget); ``slots``: the budget (None: no budget, so
    nobody waits); ``queued_records``: each queued version's records to replay; ``held``: live
    first holds the queue, so nothing starts until a moment nobody can give."""
    if held:
        return [(None, None)] * len(queued_records)
    if slots is None:
        return [(0.0, None if r is None or rate is None else r / rate) for r in queued_records]
    ends = list(running_etas)  # when each slot holder is done (None: unknown)
    result: list[tuple[float | None, float | None]] = []
    started: float | None = 0.0  # the queue starts its versions in order
    for records in queued_records:
        if started is not None:
            started = _slot_frees(ends, slots, started)
        own = None if records is None or rate is None else records / rate
        done = None if started is None or own is None else started + own
        if started is not None:  # who is done by then no longer holds a slot
            ends = [e for e in ends if e is None or e > started]
        ends.append(done)
        result.append((started, done))
    return result


def _slot_frees(ends: list[float | None], slots: int, after: float) -> float | None:
    """When fewer than ``slots`` of the holders done at ``ends`` are left, not before
    ``after``; None when that depends on a holder whose end is unknown."""
    over = len(ends) - slots  # this many must be done first, and one more
    if over < 0:
        return after
    known = sorted(e for e in ends if e is not None)
    if len(known) < len(ends) and (len(known) <= over or known[over] > after):
        return None  # an unknown end may come first: never assumed to come last
    return max(after, known[over])
