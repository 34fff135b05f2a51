"""The key as the unit of an outcome test (experiment/by_key.py), and simulated cutovers on
traffic whose keys differ, with late outcomes (experiment/simulation.py): the false decisions,
power and regret measured here are those of the look the command takes. bench/outcomes.py runs
the same simulations at the README's sizes."""

from __future__ import annotations

import random
from dataclasses import astuple, replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from orchestrator.experiment.attribution import Observation, RoutingSpan, credit, key_bucket
from orchestrator.experiment.by_key import (
    KeyedStrata,
    estimate_of,
    key_history,
    key_sums,
    keyed_arm,
    weigh,
)
from orchestrator.experiment.design import ExperimentDesign, Strategy
from orchestrator.experiment.metrics import Kind, OutcomeMetric, Role
from orchestrator.experiment.policy import Verdict
from orchestrator.experiment.simulation import (
    Traffic,
    array_key_history,
    array_key_sums,
    credit_arrays,
    proportion_summary,
    simulate,
)

CONVERTS = OutcomeMetric("converts", Kind.PROPORTION, True, Role.DECISION, sql="SELECT {since}")
ERRORS = OutcomeMetric("errors", Kind.PROPORTION, False, Role.GUARDRAIL, margin=0.2,
                       sql="SELECT {since}")
SECONDS = OutcomeMetric("seconds", Kind.MEAN, True, Role.GUARDRAIL, margin=0.1,
                        sql="SELECT {since}")
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _design(strategy: Strategy, metrics: tuple[str, ...] = ("converts",), **changes: object
            ) -> ExperimentDesign:
    values: dict[str, object] = {"look_seconds": 1.0, "max_duration_s": 10**9,
                                 "min_per_arm": 100}
    values.update(changes)
    return ExperimentDesign(strategy, metrics, **values)  # type: ignore[arg-type]


def _keyed(cells: list[list[dict[str, tuple[int, float, float]]]]) -> KeyedStrata:
    """Strata from per-stratum [baseline, candidate] cells {key: (n, sum, squares)}."""
    strata = tuple((keyed_arm(a.values()), keyed_arm(b.values())) for a, b in cells)
    weighing = weigh(strata)
    assert weighing is not None
    sums = key_sums(weighing, {"baseline": [{k: (n, y) for k, (n, y, _) in a.items()}
                                            for a, _ in cells],
                               "candidate": [{k: (n, y) for k, (n, y, _) in b.items()}
                                             for _, b in cells]})
    return KeyedStrata(strata, sums)


# The estimate ------------------------------------------------------------------------------
def test_one_observation_per_key_is_the_pooled_two_sample_test_as_before() -> None:
    a, b = proportion_summary(4000, 400), proportion_summary(1000, 130)
    by_observation = estimate_of(KeyedStrata.of_observations([(a, b)]))
    pooled = (a.squares + b.squares) / (5000 - 2)
    assert by_observation is not None
    assert by_observation.difference == pytest.approx(0.13 - 0.10)
    assert by_observation.variance == pytest.approx(pooled / 4000 + pooled / 1000)
    # The same observations as rows of one key each: the same test.
    rows = [[{f"a{i}": (1, float(i < 400), float(i < 400)) for i in range(4000)},
             {f"b{i}": (1, float(i < 130), float(i < 130)) for i in range(1000)}]]
    by_key = estimate_of(_keyed(rows))
    assert by_key is not None and by_key.keys == (4000, 1000)
    assert by_key.variance == pytest.approx(by_observation.variance)
    assert by_key.design_effect == pytest.approx(1.0)


def test_a_base_rate_that_drifts_while_the_split_moves_is_no_effect() -> None:
    day = (proportion_summary(9000, 900), proportion_summary(1000, 100))
    night = (proportion_summary(1000, 300), proportion_summary(9000, 2700))
    both = estimate_of(KeyedStrata.of_observations([day, night]))
    assert both is not None and abs(both.difference) < 1e-12 and both.strata == 2


def test_the_keys_draw_keeps_its_variance_however_many_observations() -> None:
    """Keys with their own rates: as each key is seen more, the observation-level variance goes
    to zero, while the key-level one keeps the variance of which keys each arm holds."""
    rng = random.Random(5)
    rates = {f"k{i}": rng.betavariate(2, 18) for i in range(60)}
    variances = {}
    for per_key in (20, 2000):
        cells: list[list[dict[str, tuple[int, float, float]]]] = [[{}, {}]]
        for i, (key, rate) in enumerate(rates.items()):
            hits = float(round(per_key * rate))
            cells[0][i % 2][key] = (per_key, hits, hits)
        keyed = estimate_of(_keyed(cells))
        naive = estimate_of(KeyedStrata.of_observations(_keyed(cells).summaries))
        assert keyed is not None and naive is not None
        variances[per_key] = (keyed.variance, naive.variance)
    assert variances[2000][1] == pytest.approx(variances[20][1] / 100, rel=0.2)
    assert variances[2000][0] > 0.5 * variances[20][0]
    assert variances[2000][0] > 50 * variances[2000][1]  # the design effect at 2,000 a key


def test_a_key_in_two_spans_counts_once_with_both_terms() -> None:
    cells = [[{"x": (10, 3.0, 3.0), "y": (10, 2.0, 2.0)}, {"k": (5, 1.0, 1.0), "z": (5, 2.0, 2.0)}],
             [{"x": (20, 6.0, 6.0), "y": (30, 5.0, 5.0)}, {"k": (8, 4.0, 4.0), "z": (8, 1.0, 1.0)}]]
    keyed = _keyed(cells)
    weighing = weigh(keyed.strata)
    assert weighing is not None and keyed.sums is not None
    (a1, b1), (a2, b2) = [pair for pair in weighing.coefficients if pair is not None]
    expected = sum(v * v for v in (a1.weight * 10 + a2.weight * 20, a1.weight * 10 + a2.weight * 30,
                                   b1.weight * 5 + b2.weight * 8, b1.weight * 5 + b2.weight * 8))
    assert keyed.sums.loadings == pytest.approx(expected)
    assert keyed.sums.keys == 4 and keyed.sums.baseline_count_squares == 30 ** 2 + 40 ** 2


@pytest.mark.parametrize("with_history", [False, True])
def test_the_simulations_second_pass_equals_the_reference(with_history: bool) -> None:
    rng = np.random.default_rng(9)
    n = rng.integers(0, 6, (3, 30)).astype(float)
    y = np.minimum(n, rng.integers(0, 4, (3, 30))).astype(float)
    candidate = rng.random((3, 30)) < 0.4
    history = rng.normal(0, 0.2, 30) * with_history
    unknown = 1 - rng.random(30) * with_history
    cells = [[{f"k{i}": (int(n[j, i]), y[j, i], y[j, i]) for i in range(30)
               if n[j, i] and candidate[j, i] == side} for side in (False, True)]
             for j in range(3)]
    by_name = {f"k{i}": (float(history[i]), float(unknown[i])) for i in range(30)}
    strata = tuple(tuple(keyed_arm(arm.values(), [by_name[k] for k in arm]) for arm in pair)
                   for pair in cells)
    weighing = weigh(strata)  # type: ignore[arg-type]
    assert weighing is not None and (weighing.history_slope != 0) == with_history
    reference = key_sums(weighing, {
        arm: [{k: (c[0], c[1]) for k, c in pair[side].items()} for pair in cells]
        for side, arm in enumerate(("baseline", "candidate"))}, by_name)
    assert astuple(array_key_sums(weighing, n, y, candidate, history, unknown)) == pytest.approx(
        astuple(reference))  # type: ignore[arg-type]


def test_the_simulations_key_history_is_by_keys() -> None:
    rng = np.random.default_rng(2)
    count = rng.integers(0, 30, 50).astype(float)
    total = np.minimum(count, rng.integers(0, 10, 50)).astype(float)
    shift, unknown = array_key_history(count, total, total)
    reference = key_history({f"k{i}": (int(count[i]), total[i], total[i]) for i in range(50)})
    never = count == 0
    assert shift[never].tolist() == [0.0] * int(never.sum())
    assert unknown[never].tolist() == [1.0] * int(never.sum())
    assert [v for i in range(50) if count[i] for v in (shift[i], unknown[i])] == pytest.approx(
        [v for i in range(50) if count[i] for v in reference[f"k{i}"]])
    # A key seen once is shrunk towards the others more than one seen often.
    found = key_history({"once": (1, 1.0, 1.0), "again": (1, 0.0, 0.0),
                         "often": (400, 200.0, 200.0), "also": (400, 40.0, 40.0)})
    mean = 241 / 802
    once, often = found["once"][0] / (1 - mean), found["often"][0] / (0.5 - mean)
    assert 0 < once < 0.5
    assert 0.9 < often <= 1
    assert found["once"][1] == pytest.approx(1 - once) and found["often"][1] < 0.1


def test_the_keys_history_takes_their_own_differences_out() -> None:
    """Keys whose history before the test shows their rates: the variance by key falls to
    the observations' own, and the estimate no longer carries the keys' draw."""
    rng = random.Random(8)
    rates = [rng.betavariate(2, 18) for _ in range(80)]
    cells: list[list[dict[str, tuple[int, float, float]]]] = [[{}, {}]]
    for i, rate in enumerate(rates):
        hits = float(sum(rng.random() < rate for _ in range(500)))
        cells[0][i % 2][f"k{i}"] = (500, hits, hits)
    mean = sum(rates) / len(rates)
    history = {f"k{i}": (rate - mean, 0.0) for i, rate in enumerate(rates)}
    plain = estimate_of(_keyed(cells))
    strata = tuple(tuple(keyed_arm(arm.values(), [history[k] for k in arm]) for arm in pair)
                   for pair in cells)
    weighing = weigh(strata)  # type: ignore[arg-type]
    assert weighing is not None and 0.8 < weighing.history_slope < 1.2
    sums = key_sums(weighing, {"baseline": [{k: (n, y) for k, (n, y, _) in cells[0][0].items()}],
                               "candidate": [{k: (n, y) for k, (n, y, _) in
                                              cells[0][1].items()}]}, history)
    adjusted = estimate_of(KeyedStrata(strata, sums))  # type: ignore[arg-type]
    assert plain is not None and adjusted is not None
    assert adjusted.variance < plain.variance / 5
    assert adjusted.design_effect < 2 < plain.design_effect


def test_the_simulations_attribution_is_the_pure_model_of_the_sql() -> None:
    """credit_arrays (the simulation's) against attribution.credit (the model that
    test_outcome_metrics checks the SQL against), by served_at and with a delay."""
    rng = random.Random(4)
    keys = [f"key{i}" for i in range(50)]
    buckets = np.array([key_bucket(k) for k in keys])
    percents = [0, 30, 10, 50]
    routing = [RoutingSpan(T0 + timedelta(seconds=10 * (i - 1)) if i else T0 - timedelta(hours=1),
                           "v1", "v2" if i else None, p) for i, p in enumerate(percents)]
    started, until = T0, T0 + timedelta(seconds=40)
    served = [rng.uniform(0, 38) for _ in range(3000)]
    observations = [Observation(rng.choice(keys), float(rng.random() < 0.2),
                                T0 + timedelta(seconds=s + rng.uniform(0, 15)),
                                T0 + timedelta(seconds=s)) for s in served]
    starts = np.array([-np.inf, 0.0, 10.0, 20.0])
    for by_served_at, delay in ((True, 0.0), (False, 0.0), (False, 12.0)):
        credited = credit(observations, routing[1:], ("v1", "v2"), started=started, until=until,
                          routing=routing, delay_s=delay, by_served_at=by_served_at)
        inside = [o for o in observations if o.observed_at < until]
        index = np.array([keys.index(o.key) for o in inside])
        span, kept = credit_arrays(
            np.array([(o.served_at - T0).total_seconds() for o in inside]),  # type: ignore[operator]
            np.array([(o.observed_at - T0).total_seconds() for o in inside]), buckets[index],
            starts, np.array(percents), by_served_at, delay)
        assert credited.left_out == int((~kept).sum())
        for stratum in range(3):
            for side in (0, 1):
                mine = [(keys[i], o.value) for i, o, s, k in zip(index, inside, span, kept,
                                                                  strict=True)
                        if k and s == stratum + 1 and (buckets[i] < percents[s]) == side]
                want = credited.cells[stratum][side]
                assert sum(n for n, _, _ in want.values()) == len(mine), (by_served_at, delay)
                assert sum(t for _, t, _ in want.values()) == sum(v for _, v in mine)
        if delay:
            assert credited.left_out > 0


# Simulated cutovers on keys that differ ---------------------------------------------------
A_A = Traffic(keys=40, per_look=400, base_rate=0.1, heterogeneity=20.0)


@pytest.mark.parametrize(("strategy", "keys"), [(Strategy.AB, 40), (Strategy.BANDIT, 400)])
def test_a_a_tests_on_keys_that_differ_decide_falsely_at_most_alpha(strategy: Strategy,
                                                                    keys: int) -> None:
    """Beta(2, 18) rates, Zipf visits, 100 looks of 400. Counting observations as the units
    (the command before) decides falsely in most of the same tests."""
    design = _design(strategy)
    traffic = Traffic(keys=keys, per_look=400, base_rate=0.1, heterogeneity=20.0)
    runs = 100 if strategy == Strategy.AB else 60
    by_key = [simulate(design, [CONVERTS], traffic, max_looks=100, seed=seed)
              for seed in range(runs // 2)]
    # Half of them with each key's history (20 looks' worth) taking the keys' draw out.
    by_key += [simulate(design, [CONVERTS], replace(traffic, history_looks=20), max_looks=100,
                        seed=seed) for seed in range(runs // 2, runs)]
    naive = [simulate(design, [CONVERTS], traffic, max_looks=100, seed=seed, by_key=False)
             for seed in range(20)]
    false = sum(r.verdict != Verdict.CONTINUE for r in by_key)
    false_naive = sum(r.verdict != Verdict.CONTINUE for r in naive)
    print(f"{strategy.value}, {keys} keys: {false} false decisions in {runs} A/A tests by key, "
          f"{false_naive} in 20 with the observation as the unit")
    assert false / runs <= design.alpha
    assert false_naive / 20 > 4 * design.alpha


def test_several_metrics_and_a_mean_keep_the_overall_false_decisions_within_alpha() -> None:
    design = _design(Strategy.AB, ("converts", "errors", "seconds"))
    traffic = Traffic(keys=100, per_look=400, base_rate=0.1, heterogeneity=20.0)
    runs = [simulate(design, [CONVERTS, ERRORS, SECONDS], traffic, max_looks=60, seed=seed)
            for seed in range(60)]
    false = sum(r.verdict != Verdict.CONTINUE for r in runs)
    print(f"three metrics, one a mean: {false} false decisions in 60 A/A tests")
    assert false / len(runs) <= design.alpha


def test_a_better_candidate_is_promoted_and_a_worse_one_costs_the_bandit_less() -> None:
    """Keys alike enough to tell 20 % apart: promoted when better; when worse, rolled back,
    the bandit exposing fewer readers to it than a fixed split."""
    alike = Traffic(keys=200, per_look=200, base_rate=0.3, heterogeneity=2000.0, zipf=0.0)
    design = _design(Strategy.AB, start_percent=50)
    better = [simulate(design, [CONVERTS], Traffic(**{**alike.__dict__, "lift": 1.2}),
                       max_looks=200, seed=seed) for seed in range(20)]
    assert all(r.verdict == Verdict.PROMOTE for r in better), better
    exposure = {}
    for strategy in (Strategy.AB, Strategy.BANDIT):
        worse = [simulate(_design(strategy, start_percent=50, min_percent=5, max_percent=95),
                          [CONVERTS], Traffic(**{**alike.__dict__, "lift": 0.8}),
                          max_looks=200, seed=seed) for seed in range(20)]
        assert all(r.verdict == Verdict.ROLL_BACK for r in worse), strategy
        exposure[strategy] = sum(r.candidate_observations for r in worse) / len(worse)
    print(f"readers exposed to a 20 % worse candidate: {exposure}")
    assert exposure[Strategy.BANDIT] < 0.8 * exposure[Strategy.AB]


def test_the_same_keys_in_any_order_give_the_same_bits() -> None:
    """The evidence is a sum over keys: taken in the order they happen to come, the same keys
    gave a different last bit (a killed cutover's last look against its resumed run's first).
    Exact sums (math.fsum), as the catalog's SQL takes them, show no order."""
    rng = random.Random(59)
    keys = [f"k{i}" for i in range(300)]
    # Keys whose levels differ (so that histories count), over many magnitudes (so that a sum
    # depends on the order it is taken in).
    level = {key: 10.0 ** (i % 7 - 3) for i, key in enumerate(keys)}

    def cells() -> dict[str, tuple[int, float, float]]:
        found = {}
        for key in rng.sample(keys, 200):
            values = [level[key] * rng.lognormvariate(0, 0.5) for _ in range(rng.randint(1, 9))]
            found[key] = (len(values), sum(values), sum(v * v for v in values))
        return found

    base, cand = cells(), cells()
    history = key_history(cells())

    def evidence(order: list[str]) -> tuple[object, ...]:
        a = {k: base[k] for k in order if k in base}
        b = {k: cand[k] for k in order if k in cand}
        strata = ((keyed_arm(a.values(), [history.get(k, (0.0, 1.0)) for k in a]),
                   keyed_arm(b.values(), [history.get(k, (0.0, 1.0)) for k in b])),)
        weighing = weigh(strata)
        assert weighing is not None and weighing.history_slope != 0
        sums = key_sums(weighing, {"baseline": [{k: (n, y) for k, (n, y, _) in a.items()}],
                                   "candidate": [{k: (n, y) for k, (n, y, _) in b.items()}]},
                        history)
        return (*astuple(strata[0][0]), *astuple(strata[0][1]), *astuple(sums))

    first = evidence(keys)
    for _ in range(3):
        assert evidence(rng.sample(keys, len(keys))) == first
    assert key_history(dict(reversed(list(base.items())))) == key_history(base)
