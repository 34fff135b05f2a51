"""Which version served a key at a moment, from the alias's routing history (pure).

An observation counts for the arm that served its key when it was observed, never for the
current split: a key that moved from one arm to the other during the test is credited to each
for its own time span."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime


def key_bucket(key: str) -> int:
    """The alias's bucket of a key, 0..99: catalog function key_bucket() in Python."""
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % 100


@dataclass(frozen=True)
class RoutingSpan:
    """The alias's routing from ``start`` until the next span's start."""
    start: datetime
    primary: str | None
    candidate: str | None
    percent: int  # keys whose bucket is below it go to the candidate

    def serves(self, key: str) -> str | None:
        if self.candidate is not None and key_bucket(key) < self.percent:
            return self.candidate
        return self.primary


@dataclass(frozen=True)
class Observation:
    key: str
    value: float
    observed_at: datetime


def served_by(spans: Sequence[RoutingSpan], key: str, at: datetime) -> str | None:
    """The version that served ``key`` at ``at``; None before the first span."""
    index = bisect.bisect_right([s.start for s in spans], at) - 1
    return spans[index].serves(key) if index >= 0 else None


def attribute(observations: Iterable[Observation], spans: Sequence[RoutingSpan],
              arms: Sequence[str]) -> dict[str, list[float]]:
    """The values of each arm's observations; those served by neither arm (before the test,
    or by a third version) count for none."""
    starts = [s.start for s in spans]
    if starts != sorted(starts):
        raise ValueError("routing spans must be in time order")
    values: dict[str, list[float]] = {arm: [] for arm in arms}
    for obs in observations:
        index = bisect.bisect_right(starts, obs.observed_at) - 1
        if index < 0:
            continue
        arm = spans[index].serves(obs.key)
        if arm in values:
            values[arm].append(obs.value)
    return values


def span_after(at: datetime, action: str, from_version: str | None, to_version: str | None,
               percent: int) -> RoutingSpan:
    """The routing that one switch of the alias's history left, from its instant on: an A/B
    keeps the primary and serves ``percent`` of the keys from its target; a promote and a
    rollback serve every key from theirs."""
    if action == "ab":
        return RoutingSpan(at, from_version, to_version, percent)
    return RoutingSpan(at, to_version, None, 0)


def spans_since(spans: Sequence[RoutingSpan], since: datetime) -> list[RoutingSpan]:
    """The spans that cover ``since`` and after: the one in force at ``since`` starts there."""
    index = bisect.bisect_right([s.start for s in spans], since) - 1
    kept = list(spans[max(index, 0):])
    if index >= 0:
        first = kept[0]
        kept[0] = RoutingSpan(since, first.primary, first.candidate, first.percent)
    return kept
