"""The bandit's policy: Thompson sampling's allocation over the two arms (pure).

Thompson sampling serves each reader from the arm that a draw from the posteriors says is
best; over many readers the candidate's share is the posterior probability that it is the
better arm ("randomized probability matching", Scott 2010). Keys are routed by share, not
reader by reader, so that probability is what we need, and it is computed in closed form rather
than drawn: the same evidence always gives the same share, and a resumed cutover moves exactly as
the killed one would have.

- The posterior of the difference is normal around the test's own estimate, with the model's
  variance by key (:mod:`orchestrator.experiment.by_key`): the keys that each arm happens to
  hold are part of the uncertainty, so a share does not chase the fixed difference that one
  draw of keys makes between two equal versions. (The test takes the larger of the model's and
  the sandwich's; the sandwich, noisy on few keys, would only slow the share down.)
- The share moves towards 100 x that probability by at most ``max_step`` points per look and
  stays within ``[min_percent, max_percent]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.errors import StateError
from orchestrator.experiment.by_key import Estimate


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


def probability_better(found: Estimate, higher_is_better: bool) -> float:
    """The posterior probability that the candidate is the better arm."""
    if not 0 < found.model_variance < math.inf:
        return 0.5
    z = found.difference / math.sqrt(found.model_variance)
    if not higher_is_better:
        z = -z
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def next_percent(current: int, p_better: float, limits: ShareLimits) -> int:
    target = round(100 * p_better)
    step = max(-limits.max_step, min(limits.max_step, target - current))
    return max(limits.min_percent, min(limits.max_percent, current + step))
