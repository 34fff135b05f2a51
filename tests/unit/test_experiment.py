"""The outcome cutover's pure parts: attribution by time, the always-valid statistics, the
bandit and the policy, with error rates measured over simulated experiments."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import KappaError
from orchestrator.experiment.attribution import Observation, RoutingSpan, attribute, key_bucket
from orchestrator.experiment.bandit import next_percent, probability_better
from orchestrator.experiment.by_key import KeyedStrata, estimate_of
from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.experiment.look import take_look
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
from orchestrator.experiment.policy import Judgement, Verdict, decide, judge
from orchestrator.experiment.sequential import (
    NOTHING,
    ArmSummary,
    Stratum,
    always_valid,
    merge,
    summarize,
)
from orchestrator.experiment.simulation import proportion_summary

T0 = datetime(2026, 11, 1, tzinfo=UTC)
CONVERTS = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, sql="SELECT {since}")


def _design(strategy: Strategy = Strategy.AB, **changes: object) -> ExperimentDesign:
    values: dict[str, object] = {"start_percent": 50, "min_percent": 5, "max_percent": 95,
                                 "max_step": 10, "look_seconds": 1.0,
                                 "max_duration_s": 10**9, "min_per_arm": 100}
    values.update(changes)
    return ExperimentDesign(strategy, ("converts",), **values)  # type: ignore[arg-type]


# Attribution --------------------------------------------------------------------------------
def test_a_key_moved_mid_test_counts_for_each_arm_for_its_own_time_span() -> None:
    key = "https://example.com/moved"
    bucket = key_bucket(key)
    spans = [RoutingSpan(T0, "v1", None, 0),
             RoutingSpan(T0 + timedelta(minutes=10), "v1", "v2", bucket),  # not yet: >= percent
             RoutingSpan(T0 + timedelta(minutes=20), "v1", "v2", bucket + 1),  # now the candidate
             RoutingSpan(T0 + timedelta(minutes=30), "v2", None, 0)]  # promoted
    observations = [Observation(key, 1.0, T0 - timedelta(minutes=1)),  # before any routing
                    Observation(key, 2.0, T0 + timedelta(minutes=15)),
                    Observation(key, 3.0, T0 + timedelta(minutes=20)),  # the switch's instant
                    Observation(key, 4.0, T0 + timedelta(minutes=25)),
                    Observation(key, 5.0, T0 + timedelta(minutes=35))]
    # From the A/B's start only: what v1 served before the test is no evidence.
    assert attribute(observations, spans[1:], ("v1", "v2")) == {"v1": [2.0],
                                                                "v2": [3.0, 4.0, 5.0]}


def test_the_current_split_is_never_used_for_attribution() -> None:
    keys = [f"k{i}" for i in range(400)]
    spans = [RoutingSpan(T0, "v1", "v2", 50), RoutingSpan(T0 + timedelta(hours=1), "v1", "v2", 10)]
    early = [Observation(k, 1.0, T0 + timedelta(minutes=1)) for k in keys]
    credited = attribute(early, spans, ("v1", "v2"))
    assert len(credited["v2"]) == sum(key_bucket(k) < 50 for k in keys)


def test_spans_out_of_time_order_are_refused() -> None:
    spans = [RoutingSpan(T0 + timedelta(hours=1), "v1", None, 0), RoutingSpan(T0, "v1", None, 0)]
    with pytest.raises(ValueError, match="time order"):
        attribute([], spans, ("v1",))


# Statistics ---------------------------------------------------------------------------------
@given(st.lists(st.floats(-1e6, 1e6), max_size=50), st.lists(st.floats(-1e6, 1e6), max_size=50))
def test_merged_summaries_equal_the_summary_of_both_samples(a: list[float], b: list[float]
                                                            ) -> None:
    merged, whole = merge(summarize(a), summarize(b)), summarize(a + b)
    assert merged.count == whole.count
    assert merged.total == pytest.approx(whole.total, rel=1e-9, abs=1e-6)
    assert merged.squares == pytest.approx(whole.squares, rel=1e-6, abs=1e-3)


def test_a_proportion_summary_is_the_summary_of_its_zeros_and_ones() -> None:
    direct = summarize([1.0] * 37 + [0.0] * 163)
    made = proportion_summary(200, 37)
    assert (made.count, made.total) == (direct.count, direct.total)
    assert made.squares == pytest.approx(direct.squares)


def _by_observation(strata: list[Stratum]) -> KeyedStrata:
    return KeyedStrata.of_observations(strata)


def test_no_comparison_below_the_minimum_or_without_spread() -> None:
    few = proportion_summary(50, 10)
    assert judge(CONVERTS, _by_observation([(few, few)]), alpha=0.05, mixture_sd=0.1,
                 min_per_arm=100).comparison is None
    flat = ArmSummary(500, 500.0, 0.0)
    assert estimate_of(_by_observation([(flat, flat)])) is None
    # Enough on each arm, but never in the same span: nothing to compare within a span.
    many = proportion_summary(500, 100)
    assert estimate_of(_by_observation([(many, NOTHING), (NOTHING, many)])) is None


def test_the_confidence_sequence_covers_the_true_difference_at_every_look() -> None:
    """Coverage at all looks at once: the time-uniform guarantee, not only at the end."""
    rng = random.Random(11)
    misses = 0
    for _ in range(300):
        a = b = ArmSummary(0, 0.0, 0.0)
        for _look in range(30):
            a = merge(a, summarize(rng.gauss(10.0, 2.0) for _ in range(50)))
            b = merge(b, summarize(rng.gauss(10.5, 3.0) for _ in range(50)))
            found = estimate_of(_by_observation([(a, b)]))
            assert found is not None
            c = always_valid(found.difference, found.variance, found.observation_variance, 1,
                             alpha=0.05, mixture_sd=0.2)
            if a.count >= 100 and not c.low <= 0.5 <= c.high:
                misses += 1
                break
    assert misses / 300 <= 0.05


def test_each_metric_is_tested_at_its_share_of_alpha() -> None:
    design = ExperimentDesign(Strategy.AB, ("a", "b", "c", "d"), alpha=0.08)
    assert design.alpha_per_metric == pytest.approx(0.02)


# The bandit ---------------------------------------------------------------------------------
def _p_better(baseline: ArmSummary, candidate: ArmSummary, higher: bool = True) -> float:
    found = estimate_of(_by_observation([(baseline, candidate)]))
    return 0.5 if found is None else probability_better(found, higher)


def test_the_share_follows_the_probability_that_the_candidate_is_better() -> None:
    weak, strong = proportion_summary(1000, 100), proportion_summary(1000, 140)
    assert _p_better(weak, strong) > 0.99
    assert _p_better(weak, strong, higher=False) < 0.01
    assert _p_better(weak, weak) == pytest.approx(0.5)
    assert _p_better(ArmSummary(0, 0.0, 0.0), strong) == 0.5
    # Thompson sampling's own allocation, drawn from Beta posteriors: where every key is seen
    # once, the closed form agrees within the noise.
    rng = random.Random(3)
    close = proportion_summary(400, 100), proportion_summary(400, 112)
    drawn = sum(rng.betavariate(113, 289) > rng.betavariate(101, 301) for _ in range(20_000))
    assert _p_better(*close) == pytest.approx(drawn / 20_000, abs=0.02)


@pytest.mark.parametrize(("current", "p", "expected"),
                         [(10, 0.9, 20), (10, 0.0, 5), (40, 0.45, 45), (50, 1.0, 50),
                          (12, 0.12, 12)])
def test_the_share_moves_by_at_most_a_step_within_its_limits(current: int, p: float,
                                                             expected: int) -> None:
    assert next_percent(current, p, _design(Strategy.BANDIT, max_percent=50).limits) == expected


def test_the_bandit_holds_the_share_while_there_is_no_data() -> None:
    empty = ArmSummary(0, 0.0, 0.0)
    look = take_look(_design(Strategy.BANDIT, start_percent=20), [CONVERTS],
                     {"converts": _by_observation([(empty, empty)])}, percent=20, elapsed_s=5,
                     silent_s=5)
    assert look.decision.verdict == Verdict.NO_DATA and look.percent == 20
    assert look.p_better is None


# The policy ---------------------------------------------------------------------------------
def _judged(metric: OutcomeMetric, base_rate: float, cand_rate: float, n: int = 20_000
            ) -> Judgement:
    return judge(metric, _by_observation([(proportion_summary(n, int(n * base_rate)),
                                           proportion_summary(n, int(n * cand_rate)))]),
                 alpha=0.05, mixture_sd=0.1, min_per_arm=100)


def test_a_guardrail_that_degrades_rolls_back_while_the_decision_metric_improves() -> None:
    errors = OutcomeMetric("errors", Kind.PROPORTION, False, Role.GUARDRAIL, margin=0.05,
                           sql="SELECT {since}")
    decision = decide([_judged(CONVERTS, 0.30, 0.36), _judged(errors, 0.10, 0.13)])
    assert decision.verdict == Verdict.ROLL_BACK and "guardrail errors" in decision.reason


def test_promote_needs_the_guardrails_shown_within_their_margins() -> None:
    errors = OutcomeMetric("errors", Kind.PROPORTION, False, Role.GUARDRAIL, margin=0.5,
                           sql="SELECT {since}")
    unknown = judge(errors, _by_observation([(NOTHING, NOTHING)]), alpha=0.05, mixture_sd=0.1,
                    min_per_arm=100)
    assert decide([_judged(CONVERTS, 0.30, 0.36), unknown]).verdict == Verdict.NO_DATA
    fine = decide([_judged(CONVERTS, 0.30, 0.36), _judged(errors, 0.10, 0.10)])
    assert fine.verdict == Verdict.PROMOTE


def test_at_the_deadline_only_a_non_inferior_candidate_is_promoted() -> None:
    lenient = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, margin=0.2,
                            sql="SELECT {since}")
    same = _judged(lenient, 0.30, 0.30)
    assert decide([same]).verdict == Verdict.CONTINUE
    assert decide([same], at_deadline=True).verdict == Verdict.PROMOTE
    assert decide([same], allow_non_inferior=True).verdict == Verdict.PROMOTE
    strict = _judged(CONVERTS, 0.30, 0.30)
    assert decide([strict], at_deadline=True).verdict == Verdict.ROLL_BACK


def test_no_data_for_too_long_rolls_back() -> None:
    empty = ArmSummary(0, 0.0, 0.0)
    design = _design(no_data_timeout_s=60)
    held = take_look(design, [CONVERTS], {"converts": _by_observation([(empty, empty)])},
                     percent=50, elapsed_s=30, silent_s=30)
    assert held.decision.verdict == Verdict.NO_DATA
    gone = take_look(design, [CONVERTS], {"converts": _by_observation([(empty, empty)])},
                     percent=50, elapsed_s=90, silent_s=61)
    assert gone.decision.verdict == Verdict.ROLL_BACK and "no usable evidence" in \
        gone.decision.reason


# Bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "says"), [
    ({"min_percent": 60, "max_percent": 40}, "--min-percent (60) and --max-percent (40)"),
    ({"max_step": 0}, "--max-step"),
    ({"start_percent": 70, "max_percent": 50}, "--start-percent (70) must lie within"),
    ({"alpha": 0.7}, "--alpha"),
    ({"look_seconds": 0}, "look-seconds"),
    ({"attribution_delay_s": -1}, "--attribution-delay must be 0 or more"),
])
def test_a_bad_design_is_refused_in_one_line(changes: dict[str, object], says: str) -> None:
    with pytest.raises(KappaError, match=says.replace("(", r"\(").replace(")", r"\)")) as error:
        _design(Strategy.BANDIT, **changes)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"promql": "sum(rate(clicks_total[5m]))"}, "{version} placeholder"),
    ({"sql": "SELECT key, value, observed_at FROM t"}, "{since} placeholder"),
    ({"sql": "DELETE FROM t WHERE observed_at >= {since}"}, "one SELECT that changes nothing"),
    ({"sql": "SELECT 1 FROM t WHERE at >= {since}; DROP TABLE t"}, "one SELECT"),
    ({"sql": "SELECT {since}", "promql": "x{v=\"{version}\"}"}, "exactly one of"),
])
def test_a_bad_metric_is_refused_in_one_line(kwargs: dict[str, str], says: str) -> None:
    with pytest.raises(KappaError, match=says.replace("{", r"\{").replace("}", r"\}")):
        OutcomeMetric("m", Kind.PROPORTION, True, Role.DECISION, **kwargs)  # type: ignore[arg-type]


def test_a_guardrail_needs_a_margin_and_quoted_words_are_not_statements() -> None:
    with pytest.raises(KappaError, match="needs a margin above 0"):
        OutcomeMetric("g", Kind.MEAN, True, Role.GUARDRAIL, sql="SELECT {since}")
    OutcomeMetric("m", Kind.MEAN, True, Role.DECISION,
                  sql="SELECT key, 1 AS value, at FROM t WHERE kind = 'delete' AND at >= {since}")


def test_a_design_survives_its_json() -> None:
    design = _design(Strategy.BANDIT, start_percent=20, max_percent=40)
    assert ExperimentDesign.from_json(design.to_json()) == design
