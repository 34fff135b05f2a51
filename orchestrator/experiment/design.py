"""What an outcome cutover is asked to do, checked before anything is switched (pure).

``kappa cutover JOB VERSION --strategy ab|bandit --metric NAME ...`` becomes one
:class:`ExperimentDesign`, stored with the cutover plan so that the same command resumes it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from orchestrator.errors import StateError
from orchestrator.experiment.bandit import ShareLimits
from orchestrator.naming import validate_name


class Strategy(enum.Enum):
    AB = "ab"  # a fixed split; only tests
    BANDIT = "bandit"  # Thompson sampling moves the split between looks


@dataclass(frozen=True)
class ExperimentDesign:
    strategy: Strategy
    metrics: tuple[str, ...]
    start_percent: int = 10  # the candidate's share of keys at the first look
    min_percent: int = 5  # the bandit keeps the share within [min, max]
    max_percent: int = 50
    max_step: int = 10  # points the bandit moves the share by at most, per look
    look_seconds: float = 60.0  # between looks
    max_duration_s: float = 24 * 3600.0  # then the policy's default decides
    no_data_timeout_s: float = 3600.0  # without usable evidence this long: roll back
    alpha: float = 0.05  # the chance of any false decision, over all metrics and looks
    mixture_sd: float = 0.1  # the mSPRT's mixture, in pooled standard deviations
    min_per_arm: int = 100  # no look is judged on fewer observations per arm
    allow_non_inferior: bool = False  # promote a candidate shown no worse than its margin
    # The longest time from serving a key to observing its outcome, for metrics without
    # served_at: an outcome whose key changed arm within it is left out (0: none is).
    attribution_delay_s: float = 0.0
    # How far back before the test a key's history is read (its outcomes while the baseline
    # served it): the covariate that takes the keys' own differences out of the test (0: none).
    pre_period_s: float = 86400.0

    def __post_init__(self) -> None:
        if not self.metrics:
            raise StateError("an outcome cutover needs at least one --metric NAME (defined "
                             "with `kappa metric define`)")
        for name in self.metrics:
            validate_name(name, "metric name")
        if len(set(self.metrics)) != len(self.metrics):
            raise StateError(f"--metric names repeat: {', '.join(self.metrics)}")
        limits = ShareLimits(self.min_percent, self.max_percent, self.max_step)
        if self.strategy == Strategy.AB and not 1 <= self.start_percent <= 99:
            raise StateError(f"--start-percent must be 1..99, not {self.start_percent}")
        if self.strategy == Strategy.BANDIT and not (
                limits.min_percent <= self.start_percent <= limits.max_percent):
            raise StateError(f"--start-percent ({self.start_percent}) must lie within "
                             f"--min-percent ({self.min_percent}) and --max-percent "
                             f"({self.max_percent})")
        if not 0 < self.alpha < 0.5:
            raise StateError(f"--alpha must be in (0, 0.5), like 0.05; got {self.alpha}")
        for name in ("look_seconds", "max_duration_s", "no_data_timeout_s", "mixture_sd"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise StateError(f"{name.replace('_', '-')} must be a positive number, not "
                                 f"{value}")
        if not (math.isfinite(self.attribution_delay_s) and self.attribution_delay_s >= 0):
            raise StateError(f"--attribution-delay must be 0 or more seconds (the longest time "
                             f"from serving a key to its outcome), not {self.attribution_delay_s}")
        if not (math.isfinite(self.pre_period_s) and self.pre_period_s >= 0):
            raise StateError(f"--pre-period must be 0 or more seconds (how far back before the "
                             f"test each key's history is read), not {self.pre_period_s}")
        if self.min_per_arm < 2:
            raise StateError(f"--min-per-arm must be at least 2, not {self.min_per_arm}")

    @property
    def limits(self) -> ShareLimits:
        return ShareLimits(self.min_percent, self.max_percent, self.max_step)

    @property
    def alpha_per_metric(self) -> float:
        """Bonferroni: each metric is tested at alpha / metrics, so that the chance of any
        false decision stays at most alpha."""
        return self.alpha / len(self.metrics)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["strategy"] = self.strategy.value
        out["metrics"] = list(self.metrics)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentDesign:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["strategy"] = Strategy(values["strategy"])
        values["metrics"] = tuple(values["metrics"])
        return cls(**values)
