"""Simulated outcome cutovers: the error rates, power and regret of a design, measured with the
looks that the command takes (pure; seeded).

Between two looks ``traffic`` observations arrive; each goes to the candidate with the share
of keys it has then, and converts with its arm's true rate. The statistics only see what the
command would see: per arm the count, the sum and the spread of the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.experiment.design import ExperimentDesign
from orchestrator.experiment.look import take_look
from orchestrator.experiment.metrics import OutcomeMetric
from orchestrator.experiment.policy import Verdict
from orchestrator.experiment.sequential import NOTHING, ArmSummary, Stratum, merge


@dataclass(frozen=True)
class SimulatedCutover:
    verdict: Verdict  # PROMOTE or ROLL_BACK; CONTINUE when the looks ran out first
    outcome: str  # the decision metric's outcome at the decision: better, worse, ...
    looks: int
    observations: int  # on both arms, up to the decision
    candidate_observations: int  # the exposure to the candidate: its regret when it is worse
    at_deadline: bool


def proportion_summary(count: int, hits: int) -> ArmSummary:
    """The summary of ``count`` 0/1 values of which ``hits`` are 1."""
    squares = hits - hits * hits / count if count else 0.0
    return ArmSummary(count, float(hits), squares)


def simulate(design: ExperimentDesign, metric: OutcomeMetric, *, baseline_rate: float,
             candidate_rate: float, traffic: int, max_looks: int, seed: int
             ) -> SimulatedCutover:
    """One cutover of a proportion metric, look by look, until it decides or ``max_looks``."""
    rng = np.random.default_rng(seed)
    strata: list[Stratum] = []  # one per span of the routing: a span ends when the split moves
    span_percent: int | None = None
    percent = design.start_percent
    exposed = observed = 0
    for look in range(1, max_looks + 1):
        to_candidate = int(rng.binomial(traffic, percent / 100))
        to_baseline = traffic - to_candidate
        exposed += to_candidate
        observed += traffic
        if percent != span_percent:
            strata.append((NOTHING, NOTHING))
            span_percent = percent
        base, cand = strata[-1]
        strata[-1] = (
            merge(base, proportion_summary(to_baseline,
                                           int(rng.binomial(to_baseline, baseline_rate)))),
            merge(cand, proportion_summary(to_candidate,
                                           int(rng.binomial(to_candidate, candidate_rate)))))
        elapsed = look * design.look_seconds
        result = take_look(design, [metric], {metric.name: strata}, percent=percent,
                           elapsed_s=elapsed, silent_s=0.0)
        if result.decision.verdict in (Verdict.PROMOTE, Verdict.ROLL_BACK):
            return SimulatedCutover(result.decision.verdict,
                                    result.decision.judgements[0].outcome, look, observed,
                                    exposed, elapsed >= design.max_duration_s)
        percent = result.percent
    return SimulatedCutover(Verdict.CONTINUE, "undecided", max_looks, observed, exposed, False)
