"""The cutover's decisions from the evidence (pure).

- Roll back at once when a guardrail is worse than the baseline beyond its margin, or a
  decision metric is worse at all.
- Promote when every decision metric is better and every guardrail is shown no worse than its
  margin; or, where the design allows it, when every metric is non-inferior.
- At the deadline, promote only a candidate that is non-inferior on every metric; roll back
  otherwise.
- Never decide on no data: a metric without enough observations holds the test in no_data.

Each metric is tested at alpha divided by the number of metrics (Bonferroni), so the chance of
any false decision stays at most alpha.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.experiment.by_key import Estimate, KeyedStrata, estimate_of
from orchestrator.experiment.few_keys import MIN_KEYS_PER_ARM, welch_df
from orchestrator.experiment.metrics import OutcomeMetric, Role
from orchestrator.experiment.sequential import ArmSummary, Comparison, always_valid, totals

_AT_LEAST_NON_INFERIOR = ("better", "non_inferior")


class Verdict(enum.Enum):
    CONTINUE = "continue"
    NO_DATA = "no_data"
    PROMOTE = "promote"
    ROLL_BACK = "roll_back"


@dataclass(frozen=True)
class Judgement:
    metric: OutcomeMetric
    baseline: ArmSummary
    candidate: ArmSummary
    comparison: Comparison | None  # None below min_per_arm observations on an arm
    margin: float  # absolute: the relative margin times the baseline's mean
    estimate: Estimate | None = None  # None until a span holds both arms, with some spread
    waiting: str | None = None  # why there is no comparison yet, when there is none

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The interval of the improvement (in the better direction)."""
        c = self.comparison
        if c is None:
            return None
        low, high = self.metric.improvement(c.low), self.metric.improvement(c.high)
        return min(low, high), max(low, high)

    @property
    def outcome(self) -> str:
        bounds = self.bounds
        if bounds is None:
            return "no_data"
        low, high = bounds
        if high < -self.margin:
            return "worse_beyond_margin"
        if high < 0:
            return "worse"
        if low > 0:
            return "better"
        if low > -self.margin:
            return "non_inferior"
        return "undecided"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    judgements: tuple[Judgement, ...]


def judge(metric: OutcomeMetric, data: KeyedStrata, *, alpha: float, mixture_sd: float,
          min_per_arm: int) -> Judgement:
    """``data``: per span of the alias's routing, (baseline, candidate) grouped by key."""
    baseline, candidate = totals(data.summaries)
    found = estimate_of(data)
    comparison, waiting = None, None
    if found is None:
        waiting = "no span holds both arms with some spread yet"
    elif min(baseline.count, candidate.count) < max(min_per_arm, 2):
        waiting = (f"{baseline.count} and {candidate.count} observations; each arm needs "
                   f"{max(min_per_arm, 2)}")
    else:
        df = math.inf if found.keys is None else welch_df(found.arm_variances, found.keys)
        if df > 0:
            comparison = always_valid(found.difference, found.variance,
                                      found.observation_variance, found.strata, alpha=alpha,
                                      mixture_sd=mixture_sd, df=df)
        else:
            waiting = (f"{found.keys[0] if found.keys else 0} and "
                       f"{found.keys[1] if found.keys else 0} keys; each arm needs "
                       f"{MIN_KEYS_PER_ARM} to judge the spread between keys")
    base = baseline.mean
    return Judgement(metric, baseline, candidate, comparison,
                     metric.margin * abs(base) if base is not None else 0.0, found, waiting)


def decide(judgements: Sequence[Judgement], *, at_deadline: bool = False,
           allow_non_inferior: bool = False) -> Decision:
    found = tuple(judgements)

    def named(role: Role, *outcomes: str) -> list[str]:
        return [j.metric.name for j in found if j.metric.role == role and j.outcome in outcomes]

    bad_guards = named(Role.GUARDRAIL, "worse_beyond_margin")
    if bad_guards:
        return Decision(Verdict.ROLL_BACK, f"guardrail {', '.join(bad_guards)} worse than the "
                        "baseline beyond its margin", found)
    worse = named(Role.DECISION, "worse", "worse_beyond_margin")
    if worse:
        return Decision(Verdict.ROLL_BACK, f"{', '.join(worse)} worse than the baseline", found)
    deciding = [j for j in found if j.metric.role == Role.DECISION]
    guards = [j for j in found if j.metric.role == Role.GUARDRAIL]
    guards_hold = all(j.outcome in _AT_LEAST_NON_INFERIOR for j in guards)
    missing = [j.metric.name for j in found if j.outcome == "no_data"]
    if deciding and guards_hold and all(j.outcome == "better" for j in deciding):
        return Decision(Verdict.PROMOTE, f"{', '.join(j.metric.name for j in deciding)} better "
                        "than the baseline" + (", guardrails within their margins" if guards
                                               else ""), found)
    non_inferior = guards_hold and all(j.outcome in _AT_LEAST_NON_INFERIOR for j in deciding)
    if non_inferior and allow_non_inferior:
        return Decision(Verdict.PROMOTE, "every metric non-inferior within its margin", found)
    if at_deadline:
        if non_inferior:
            return Decision(Verdict.PROMOTE, "at the deadline: every metric non-inferior within "
                            "its margin", found)
        return Decision(Verdict.ROLL_BACK, "at the deadline: not shown non-inferior"
                        + (f" (no data: {', '.join(missing)})" if missing else ""), found)
    if missing:
        why = [f"{j.metric.name} ({j.waiting})" if j.waiting else j.metric.name
               for j in found if j.outcome == "no_data"]
        return Decision(Verdict.NO_DATA, f"not enough evidence yet: {', '.join(why)}", found)
    return Decision(Verdict.CONTINUE, "no metric decided yet", found)
