"""Which version served a key at a moment, from the alias's routing history (pure).

An observation counts for the arm that served its key when it was served (where the metric
gives ``served_at``) or else when it was observed, never for the current split: a key that moved
from one arm to the other during the test is credited to each for its own time span. An outcome
observed some time after its key was served may belong to the arm the key had before it moved;
with an attribution delay D, an observation whose key changed arm within D before it was
observed is left out (and counted). This module is the model of the SQL that the command runs
(catalog/outcomes.py), checked against it by an integration test."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


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
    served_at: datetime | None = None


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


@dataclass(frozen=True)
class Credited:
    """Per stratum (a span of the test's routing) and arm, {key: (observations, sum, sum of
    squares)}; and how many observations were left out because their key moved."""
    cells: tuple[tuple[dict[str, tuple[int, float, float]], ...], ...]  # [stratum][arm]
    left_out: int
    before: dict[str, tuple[int, float, float]]  # per key before the test: n, sum, squares


def credit(observations: Iterable[Observation], spans: Sequence[RoutingSpan],
           arms: Sequence[str], *, started: datetime, until: datetime,
           routing: Sequence[RoutingSpan] = (), delay_s: float = 0.0,
           by_served_at: bool = False, history_since: datetime | None = None) -> Credited:
    """The test's evidence as the SQL computes it. ``spans``: the test's strata, from
    ``started``; ``routing``: the alias's spans from the earlier of ``started - delay_s`` (the
    window's look back) and ``history_since`` (from then until ``started``, what the keys did
    while the baseline, ``arms[0]``, served them). Observations at or after ``until``,
    credited before ``started``, or to neither arm, count for none."""
    starts = [s.start for s in spans]
    window = [s.start for s in routing]
    cells: list[tuple[dict[str, tuple[int, float, float]], ...]] = [
        tuple({} for _ in arms) for _ in spans]
    left_out = 0
    before: dict[str, tuple[int, float, float]] = {}
    for obs in observations:
        at = obs.served_at if by_served_at else obs.observed_at
        if at is None or obs.observed_at >= until:
            continue
        if at < started:
            at_index = bisect.bisect_right(window, at) - 1
            if (history_since is not None and at >= history_since and at_index >= 0
                    and routing[at_index].serves(obs.key) == arms[0]):
                n, total, squares = before.get(obs.key, (0, 0.0, 0.0))
                before[obs.key] = (n + 1, total + obs.value, squares + obs.value * obs.value)
            continue
        index = bisect.bisect_right(starts, at) - 1
        if index < 0:
            continue
        arm = spans[index].serves(obs.key)
        if arm not in arms:
            continue
        if delay_s > 0 and not by_served_at:
            first = max(bisect.bisect_right(window, obs.observed_at - timedelta(
                seconds=delay_s)) - 1, 0)
            last = bisect.bisect_right(window, obs.observed_at) - 1
            if any(routing[i].serves(obs.key) != arm for i in range(first, last + 1)):
                left_out += 1
                continue
        by_key = cells[index][arms.index(arm)]
        n, total, squares = by_key.get(obs.key, (0, 0.0, 0.0))
        by_key[obs.key] = (n + 1, total + obs.value, squares + obs.value * obs.value)
    return Credited(tuple(cells), left_out, before)


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
