"""One look at an outcome cutover: judge every metric, decide, and (for the bandit) choose the
candidate's share until the next look (pure).

The CLI's runner and the simulations of the tests and benchmarks take the same look, so the
error rates measured in simulation are those of the command."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.experiment.bandit import next_percent, probability_better
from orchestrator.experiment.by_key import KeyedStrata
from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.experiment.metrics import OutcomeMetric, Role
from orchestrator.experiment.policy import Decision, Verdict, decide, judge


@dataclass(frozen=True)
class Look:
    decision: Decision
    percent: int  # the candidate's share of keys until the next look
    p_better: float | None  # the bandit's posterior probability that the candidate is better


def take_look(design: ExperimentDesign, metrics: Sequence[OutcomeMetric],
              strata: Mapping[str, KeyedStrata], *, percent: int,
              elapsed_s: float, silent_s: float, refusal: str | None = None) -> Look:
    """``strata``: per metric name, (baseline, candidate) per span of the routing since the
    test began, grouped by key. ``silent_s``: how long the test has gone without usable
    evidence (every metric judged), 0 when this look has it. ``refusal``: why this look's
    evidence cannot be trusted (clocks apart): no_data, whatever the figures say."""
    judgements = [judge(m, strata[m.name], alpha=design.alpha_per_metric,
                        mixture_sd=design.mixture_sd, min_per_arm=design.min_per_arm)
                  for m in metrics]
    if refusal is not None:
        decision = Decision(Verdict.NO_DATA, refusal, tuple(judgements))
    else:
        decision = decide(judgements, at_deadline=elapsed_s >= design.max_duration_s,
                          allow_non_inferior=design.allow_non_inferior)
    if decision.verdict == Verdict.NO_DATA and silent_s >= design.no_data_timeout_s:
        decision = Decision(Verdict.ROLL_BACK, f"no usable evidence for {silent_s:.0f} s "
                            f"({decision.reason}); the policy rolls back on no data",
                            decision.judgements)
    if design.strategy != Strategy.BANDIT or refusal is not None or decision.verdict not in (
            Verdict.CONTINUE, Verdict.NO_DATA):
        return Look(decision, percent, None)
    # Thompson sampling on the first decision metric, from the same estimate as the test (the
    # key as the unit). The share moves as soon as a span holds both arms (a decision waits
    # for ``min_per_arm``); a metric whose query failed has none, and the share stays.
    leading = next(j for j in decision.judgements if j.metric.role == Role.DECISION)
    if leading.estimate is None:
        return Look(decision, percent, None)
    p_better = probability_better(leading.estimate, leading.metric.higher_is_better)
    return Look(decision, next_percent(percent, p_better, design.limits), p_better)
