"""The key is the unit: each arm's mean and variance when the alias splits keys, not
observations (pure).

The alias sends a *key* to one arm, and every observation of that key goes with it. Keys differ
(a home page converts more than a help page; a heavy user comes back a thousand times), so which
keys land in the candidate's buckets is one draw: in an A/A test the arms' means differ by a
fixed amount, and an observation-level variance goes to zero under it. The variance here has a
term for the keys themselves, which does not (Deng, Knoblich and Lu, "Applying the Delta Method
in Metric Analytics", KDD 2018).

Each arm's mean in a stratum (a span of the routing) is a ratio: the sum of the values over
their count. The estimate is the strata's differences weighted by their precision (as before).
It is a linear function of every key's sums, so its variance is a sum over keys, and a key seen
in several strata counts once, with all its terms (that is what keeps the bandit's moving split
valid: a key keeps its rate from one span to the next). Two estimates of that variance:

- the *model*: a key's values scatter around the key's own mean (within variance ``sigma2``),
  and the keys' means around the arm's (between variance ``tau2``), both pooled over both arms
  and every stratum, as the null hypothesis allows (one-way random-effects ANOVA, unbalanced);
  stable with few keys in an arm;
- the *sandwich* (cluster-robust, the delta method's own): the squared sum of each key's
  residuals; right whatever the keys look like, but only once an arm has many keys.

The test uses the larger. Where no key has more than one observation, the key is the
observation, both reduce to the pooled two-sample variance, and the test is the one before
(the model alone).

Before either, each value may be adjusted by its key's *history*: the key's mean before the
test, while the baseline served it (CUPED, :func:`history_slope`). What a key did before the
test is no evidence about the versions, and taking it out takes out most of the keys' variance.

Two passes: :func:`weigh` reads per stratum and arm a few sums of the keys' sums (one row each
in SQL); the second pass, :class:`KeySums`, needs each key's sums against the first pass's
coefficients (one more aggregate in SQL, or numpy in the simulations).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.experiment.sequential import ArmSummary


@dataclass(frozen=True)
class KeyedArm:
    """One arm within one stratum: its observations, and the same grouped by key."""
    count: int  # observations
    total: float  # their values' sum
    squares: float  # their values' squares' sum
    keys: int  # keys with an observation
    count_squares: float  # sum over keys of (the key's observations)^2
    key_squares: float  # sum over keys of (the key's sum)^2 / (the key's observations)
    # Against each key's history h_i (its mean before the test less all keys' mean; 0 for a
    # key without one): sum n_i h_i, sum n_i h_i^2, sum y_i h_i.
    count_history: float = 0.0
    history_squares: float = 0.0
    total_history: float = 0.0
    # And u_i, how much of the key's own level its history leaves unknown (1 without one):
    # sum n_i u_i and sum n_i^2 u_i; None: every u_i is 1.
    count_unknown: float | None = None
    count_squares_unknown: float | None = None

    @property
    def unknown_count(self) -> float:
        return self.count if self.count_unknown is None else self.count_unknown

    @property
    def unknown_count_squares(self) -> float:
        return (self.count_squares if self.count_squares_unknown is None
                else self.count_squares_unknown)

    @property
    def summary(self) -> ArmSummary:
        """The observations' count, sum and spread (Welford's M2), as before keys counted."""
        if not self.count:
            return ArmSummary(0, 0.0, 0.0)
        return ArmSummary(self.count, self.total,
                          max(0.0, self.squares - self.total * self.total / self.count))

    @classmethod
    def of_observations(cls, summary: ArmSummary) -> KeyedArm:
        """Every observation its own key: the only view of counters without a key label."""
        if not summary.count:
            return NO_KEYS
        raw = summary.squares + summary.total * summary.total / summary.count
        return cls(summary.count, summary.total, raw, summary.count, float(summary.count), raw)


NO_KEYS = KeyedArm(0, 0.0, 0.0, 0, 0.0, 0.0)
KeyedStratum = tuple[KeyedArm, KeyedArm]  # (baseline, candidate) within one routing span


def keyed_arm(cells: Iterable[tuple[int, float, float]],
              history: Iterable[tuple[float, float]] | None = None) -> KeyedArm:
    """An arm from its keys' (observations, sum, sum of squares), and their histories
    (:func:`key_history`'s (shift, unknown) per key)."""
    kept = [(n, y, q, h, u) for (n, y, q), (h, u) in zip(
        cells, history if history is not None else _no_history(), strict=False) if n > 0]
    # Summed exactly (math.fsum): the same keys give the same bits in whatever order they come.
    return KeyedArm(sum(n for n, *_ in kept), math.fsum(y for _, y, *_ in kept),
                    math.fsum(q for _, _, q, _, _ in kept), len(kept),
                    float(sum(n * n for n, *_ in kept)),
                    math.fsum(y * y / n for n, y, *_ in kept),
                    math.fsum(n * h for n, _, _, h, _ in kept),
                    math.fsum(n * h * h for n, _, _, h, _ in kept),
                    math.fsum(y * h for _, y, _, h, _ in kept),
                    math.fsum(n * u for n, *_, u in kept),
                    math.fsum(n * n * u for n, *_, u in kept))


def _no_history() -> Iterable[tuple[float, float]]:
    while True:
        yield 0.0, 1.0


def key_history(before: Mapping[str, tuple[int, float, float]]
                ) -> dict[str, tuple[float, float]]:
    """Each key's history from its (observations, sum, sum of squares) before the test: its
    *shift*, its mean less the mean of every observation then, shrunk by how much of its spread
    is the key's own and not noise (empirical Bayes: a key seen twice tells little about
    itself, one seen ten thousand times all); and what its level still has *unknown*, 1 less
    that reliability (the key's own variance after its history, relative to the keys'). The
    catalog's SQL computes the same."""
    seen = {key: cell for key, cell in before.items() if cell[0] > 0}
    count = sum(n for n, _, _ in seen.values())
    if not count:
        return {}
    mean = math.fsum(y for _, y, _ in seen.values()) / count
    within_df = count - len(seen)
    within = (math.fsum(q - y * y / n for n, y, q in seen.values()) / within_df
              if within_df > 0 else 0.0)
    between_squares = math.fsum(y * y / n for n, y, _ in seen.values()) - count * mean * mean
    scale = count - sum(n * n for n, _, _ in seen.values()) / count
    between = (max(0.0, (between_squares - within * (len(seen) - 1)) / scale)
               if scale > 0 else 0.0)
    found = {}
    for key, (n, y, _) in seen.items():
        known = _reliability(n, between, within)
        found[key] = (known * (y / n - mean), 1.0 - known)
    return found


def _reliability(count: float, between: float, within: float) -> float:
    signal = count * between
    return signal / (signal + within) if signal + within > 0 else 0.0


def history_slope(strata: Sequence[KeyedStratum]) -> float:
    """theta: how much of a key's history carries over into the test (CUPED's coefficient),
    the regression of the keys' values on their histories within each stratum and arm,
    pooled over both arms (the null hypothesis lets it)."""
    cells = [arm for a, b in strata if a.count and b.count for arm in (a, b)]
    across = sum(c.total_history - c.total * c.count_history / c.count for c in cells)
    spread = sum(c.history_squares - c.count_history ** 2 / c.count for c in cells)
    return across / spread if spread > 1e-12 else 0.0


def adjusted(arm: KeyedArm, theta: float) -> KeyedArm:
    """The arm of the values less theta times their key's history (one value per
    observation, so every figure of the key-level model is that of the adjusted values)."""
    if not theta or not arm.count:
        return arm
    shift = 2 * theta * arm.total_history - theta * theta * arm.history_squares
    return KeyedArm(arm.count, arm.total - theta * arm.count_history, arm.squares - shift,
                    arm.keys, arm.count_squares, arm.key_squares - shift,
                    count_unknown=arm.count_unknown,
                    count_squares_unknown=arm.count_squares_unknown)


@dataclass(frozen=True)
class Coefficient:
    """What one key's sums in one stratum and arm add to the estimate: ``weight`` times the
    key's sum, and ``mean`` its residuals' centre."""
    weight: float
    mean: float


@dataclass(frozen=True)
class KeySums:
    """The second pass over the keys, against a :class:`Weighing`'s coefficients. For key i
    with n_ij observations summing to y_ij in stratum j, L_i = sum_j c_j n_ij and
    psi_i = sum_j c_j (y_ij - m_j n_ij), over the strata and arm that held it."""
    loadings: float  # sum_i L_i^2 u_i (u_i: what the key's history leaves unknown, 1 without)
    residuals: float  # sum_i psi_i^2
    keys: int  # keys with an observation in a stratum that holds both arms
    baseline_keys: int
    candidate_keys: int
    baseline_count_squares: float  # sum over the baseline's keys of (their observations)^2 u_i
    candidate_count_squares: float


@dataclass(frozen=True)
class Weighing:
    """The first pass: each usable stratum's weight, the estimate, and the variance parts."""
    difference: float
    coefficients: tuple[tuple[Coefficient, Coefficient] | None, ...]  # None: a stratum unused
    within: float  # sigma2: the variance of a key's values around the key's mean
    between: float  # tau2: the variance of the keys' means around their arm's
    observation_variance: float  # the pooled variance of one observation
    observation_terms: float  # sum_j w_j^2 (1 / N_aj + 1 / N_bj): the observations' share
    strata: int
    baseline_count: int
    candidate_count: int
    one_observation_per_key: bool  # the key is the observation: no sandwich needed
    history_slope: float = 0.0  # theta: the values were adjusted by theta x their key's history


@dataclass(frozen=True)
class Estimate:
    """Candidate minus baseline, with its variance with the key as the unit."""
    difference: float
    variance: float  # the test's: the larger of the model's and the sandwich's
    model_variance: float  # the model's alone: steadier, what the bandit's posterior takes
    observation_variance: float  # of one observation: the mixture's scale
    design_effect: float  # variance over what counting observations as units would say
    strata: int
    keys: tuple[int, int] | None  # (baseline, candidate); None: observations are the units
    arm_variances: tuple[float, float]  # each arm's mean's variance, by key
    history_slope: float = 0.0  # theta of the keys' histories (0: none read, or none helps)


def weigh(strata: Sequence[KeyedStratum]) -> Weighing | None:
    """None until some stratum holds both arms and the values have some spread. The values
    are first adjusted by their keys' histories (CUPED: Deng, Xu, Kohavi and Walker, WSDM
    2013): the part of a key's difference from the others that it had before the test is no
    evidence about the versions, and with it goes most of the keys' variance."""
    theta = history_slope(strata)
    strata = [(adjusted(a, theta), adjusted(b, theta)) for a, b in strata]
    usable = [(a, b) for a, b in strata if a.count and b.count]
    if not usable:
        return None
    cells = [arm for pair in usable for arm in pair]
    within_squares = sum(c.squares - c.key_squares for c in cells)
    within_df = sum(c.count - c.keys for c in cells)
    between_squares = sum(c.key_squares - c.total * c.total / c.count for c in cells)
    between_df = sum(c.keys - 1 for c in cells)
    # A key's own variance is taken as proportional to what its history leaves unknown.
    between_scale = sum(c.unknown_count - c.unknown_count_squares / c.count for c in cells)
    around_cells = sum(c.squares - c.total * c.total / c.count for c in cells)
    cell_df = sum(c.count - 1 for c in cells)
    within = max(0.0, within_squares / within_df) if within_df > 0 else 0.0
    between = (max(0.0, (between_squares - within * between_df) / between_scale)
               if between_scale > 0 else 0.0)
    observation_variance = max(0.0, around_cells / cell_df) if cell_df > 0 else 0.0
    variances = [between * (a.unknown_count_squares / a.count ** 2
                            + b.unknown_count_squares / b.count ** 2)
                 + within * (1 / a.count + 1 / b.count) for a, b in usable]
    if min(variances) <= 0 or observation_variance <= 0:
        return None  # every value equal (or every key's): no evidence either way
    precision = sum(1 / v for v in variances)
    shares = iter([(1 / v) / precision for v in variances])
    coefficients: list[tuple[Coefficient, Coefficient] | None] = []
    difference = terms = 0.0
    for a, b in strata:
        if not (a.count and b.count):
            coefficients.append(None)
            continue
        share = next(shares)
        base_mean, cand_mean = a.total / a.count, b.total / b.count
        difference += share * (cand_mean - base_mean)
        terms += share * share * (1 / a.count + 1 / b.count)
        coefficients.append((Coefficient(-share / a.count, base_mean),
                             Coefficient(share / b.count, cand_mean)))
    return Weighing(difference, tuple(coefficients), within, between, observation_variance,
                    terms, len(usable), sum(a.count for a, _ in strata),
                    sum(b.count for _, b in strata),
                    all(c.count_squares == c.count for c in cells), theta)


def estimate(weighing: Weighing, sums: KeySums | None) -> Estimate:
    """The estimate's variance from both passes; ``sums`` None: every observation is its own
    key (counters without a key label), and the variance is the pooled two-sample one."""
    w = weighing
    by_observation = w.observation_variance * w.observation_terms
    if sums is None:
        arms = (w.observation_variance / max(w.baseline_count, 1),
                w.observation_variance / max(w.candidate_count, 1))
        return Estimate(w.difference, by_observation, by_observation, w.observation_variance,
                        1.0, w.strata, None, arms)
    model = w.between * sums.loadings + w.within * w.observation_terms
    variance = model
    if not w.one_observation_per_key or sums.keys != w.baseline_count + w.candidate_count:
        sandwich = sums.residuals * sums.keys / (sums.keys - 1) if sums.keys > 1 else math.inf
        variance = max(model, sandwich)
    arms = (_arm_variance(w, sums.baseline_count_squares, w.baseline_count),
            _arm_variance(w, sums.candidate_count_squares, w.candidate_count))
    return Estimate(w.difference, variance, model, w.observation_variance,
                    variance / by_observation if by_observation > 0 else 1.0, w.strata,
                    (sums.baseline_keys, sums.candidate_keys), arms, w.history_slope)


def _arm_variance(w: Weighing, count_squares: float, count: int) -> float:
    if count <= 0:
        return math.inf
    return w.between * count_squares / (count * count) + w.within / count


@dataclass(frozen=True)
class KeyedStrata:
    """One metric's evidence at a look: per routing span, each arm grouped by key, and the
    second pass against the first's coefficients (None: every observation is its own key)."""
    strata: tuple[KeyedStratum, ...]
    sums: KeySums | None

    @classmethod
    def of_observations(cls, strata: Sequence[tuple[ArmSummary, ArmSummary]]) -> KeyedStrata:
        return cls(tuple((KeyedArm.of_observations(a), KeyedArm.of_observations(b))
                         for a, b in strata), None)

    @property
    def summaries(self) -> list[tuple[ArmSummary, ArmSummary]]:
        return [(a.summary, b.summary) for a, b in self.strata]


NO_EVIDENCE = KeyedStrata((), None)


def estimate_of(data: KeyedStrata) -> Estimate | None:
    weighing = weigh(data.strata)
    return None if weighing is None else estimate(weighing, data.sums)


# The second pass over per-key cells held in memory (tests, and the reference of the SQL) ------
Cell = tuple[int, float]  # (observations, sum) of one key in one stratum and arm


def key_sums(weighing: Weighing, cells: Mapping[str, Sequence[Mapping[str, Cell]]],
             history: Mapping[str, tuple[float, float]] | None = None) -> KeySums:
    """``cells``: per stratum, (baseline, candidate) as {key: (observations, sum)}, given as
    ``{"baseline": [...per stratum...], "candidate": [...]}``; ``history``: each key's
    (shift, unknown) from :func:`key_history`."""
    theta, histories = weighing.history_slope, history or {}
    loading: dict[str, float] = {}
    residual: dict[str, float] = {}
    arm_counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for side, arm in enumerate(("baseline", "candidate")):
        for index, by_key in enumerate(cells[arm]):
            pair = weighing.coefficients[index]
            for key, (n, y) in by_key.items():
                if n <= 0:
                    continue
                arm_counts[side][key] = arm_counts[side].get(key, 0) + n
                if pair is None:
                    continue
                c = pair[side]
                adjusted_sum = y - theta * n * histories.get(key, (0.0, 1.0))[0]
                loading[key] = loading.get(key, 0.0) + c.weight * n
                residual[key] = residual.get(key, 0.0) + c.weight * (adjusted_sum - c.mean * n)

    def unknown(key: str) -> float:
        return histories.get(key, (0.0, 1.0))[1]

    # Exact sums (math.fsum), as the catalog's SQL takes them: no order shows in the bits.
    return KeySums(math.fsum(v * v * unknown(k) for k, v in loading.items()),
                   math.fsum(v * v for v in residual.values()), len(loading), len(arm_counts[0]),
                   len(arm_counts[1]),
                   math.fsum(n * n * unknown(k) for k, n in arm_counts[0].items()),
                   math.fsum(n * n * unknown(k) for k, n in arm_counts[1].items()))
