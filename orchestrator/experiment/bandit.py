"""The bandit's policy: Thompson sampling's allocation over the two arms (pure).

Thompson sampling serves each reader from the arm that a draw from the posteriors says is
best; over many readers the candidate's share is the posterior probability that it is the
better arm ("randomized probability matching", Scott 2010). Keys are routed by share, not
reader by reader, so that probability is what we need, and it is computed in closed form rather
than drawn: the same evidence always gives the same share, and a resumed cutover moves exactly as
the killed one would have.

- Proportions have Beta(1 + conversions, 1 + misses) posteriors, means a normal posterior around
  the sample mean; the probability that one arm beats the other takes the normal approximation
  of each posterior (good once each arm has a few dozen observations; no share moves before
  ``min_per_arm``).
- The share moves towards 100 x that probability by at most ``max_step`` points per look and
  stays within ``[min_percent, max_percent]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.errors import StateError
from orchestrator.experiment.metrics import Kind
from orchestrator.experiment.sequential import ArmSummary


@dataclass(frozen=True)
class ShareLimits:
    min_percent: int
    max_percent: int
    max_step: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_percent <= self.max_percent <= 99:
            raise StateError(f"--min-percent ({self.min_percent}) and --max-percent "
                             f"({self.max_percent}) must satisfy 1 <= min <= max <= 99")
        if self.max_step < 1:
            raise StateError(f"--max-step must be at least 1 point, not {self.max_step}")


def posterior(arm: ArmSummary, kind: Kind) -> tuple[float, float] | None:
    """The posterior's mean and variance; None without enough data for one."""
    if kind == Kind.PROPORTION:
        hits = min(max(arm.total, 0.0), float(arm.count))
        a, b = 1 + hits, 1 + arm.count - hits
        return a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    mean, variance = arm.mean, arm.variance
    if mean is None or variance is None:
        return None
    return mean, variance / arm.count


def probability_better(baseline: ArmSummary, candidate: ArmSummary, kind: Kind,
                       higher_is_better: bool) -> float:
    """The posterior probability that the candidate is the better arm (0.5 without data)."""
    a, b = posterior(baseline, kind), posterior(candidate, kind)
    if a is None or b is None or a[1] + b[1] <= 0:
        return 0.5
    z = (b[0] - a[0]) / math.sqrt(a[1] + b[1])
    if not higher_is_better:
        z = -z
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def next_percent(current: int, p_better: float, limits: ShareLimits) -> int:
    target = round(100 * p_better)
    step = max(-limits.max_step, min(limits.max_step, target - current))
    return max(limits.min_percent, min(limits.max_percent, current + step))
