"""Simulated outcome cutovers on traffic that looks like real traffic: the error rates, power and
regret of a design, measured with the looks that the command takes (pure; seeded).

Keys differ: each has its own rate (Beta(a, b) around the base rate) and its own share of the
visits (Zipf: the k-th most visited key gets 1 / k^s of them). The alias sends a key to the
candidate when its bucket is below the share, as ``key_bucket`` does; an outcome is observed a
random delay after its key was served, and is credited as :mod:`attribution` credits it (the
model of the SQL that the command runs): to the version that served the key when it was
*observed*, leaving out those whose key moved within ``attribution_delay`` before, or when it was
*served*, where the metric says so. The statistics see what the command would see: per routing
span and key, the observations' count, sum and sum of squares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from orchestrator.experiment.attribution import key_bucket
from orchestrator.experiment.by_key import (
    KeyedArm,
    KeyedStrata,
    KeySums,
    Weighing,
    weigh,
)
from orchestrator.experiment.design import ExperimentDesign
from orchestrator.experiment.look import take_look
from orchestrator.experiment.metrics import Kind, OutcomeMetric
from orchestrator.experiment.policy import Verdict
from orchestrator.experiment.sequential import ArmSummary

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Traffic:
    """Who reads, how often, and how each version converts them."""
    keys: int = 400
    per_look: int = 400  # observations served between two looks
    base_rate: float = 0.1  # the keys' mean rate on the baseline (a proportion)
    heterogeneity: float = 20.0  # a + b of the keys' Beta rates: smaller, more different keys
    lift: float = 1.0  # the candidate's rate over the baseline's, the same for every key
    zipf: float = 1.0  # visits per key fall as 1 / rank^zipf (0: every key alike)
    max_delay_looks: float = 0.0  # an outcome is observed up to this long after its serving
    by_served_at: bool = False  # the metric gives served_at: credit the serving version
    history_looks: int = 0  # looks' worth of traffic before the test, the baseline serving all
    mean_metric: bool = False  # also a mean (seconds on the page), keys' means lognormal


@dataclass(frozen=True)
class SimulatedCutover:
    verdict: Verdict  # PROMOTE or ROLL_BACK; CONTINUE when the looks ran out first
    outcome: str  # the decision metric's outcome at the decision: better, worse, ...
    looks: int
    observations: int  # served, on both arms, up to the decision
    candidate_observations: int  # the exposure to the candidate: its regret when it is worse
    at_deadline: bool
    left_out: int  # observations that attribution left out (their key moved)


def proportion_summary(count: int, hits: int) -> ArmSummary:
    """The summary of ``count`` 0/1 values of which ``hits`` are 1."""
    squares = hits - hits * hits / count if count else 0.0
    return ArmSummary(count, float(hits), squares)


class _Cells:
    """Per routing span and key: observations, sum, sum of squares (one metric)."""

    def __init__(self, spans: int, keys: int):
        self.n = np.zeros((spans, keys))
        self.y = np.zeros((spans, keys))
        self.q = np.zeros((spans, keys))

    def add(self, span: npt.NDArray[np.int64], key: npt.NDArray[np.int64],
            value: Floats) -> None:
        np.add.at(self.n, (span, key), 1.0)
        np.add.at(self.y, (span, key), value)
        np.add.at(self.q, (span, key), value * value)

    def strata(self, candidate: npt.NDArray[np.bool_], spans: int, by_key: bool,
               history: Floats, unknown: Floats) -> KeyedStrata:
        """Spans 1..spans-1 (span 0 is before the test); ``history`` and ``unknown``: each
        key's (by_key.key_history)."""
        n, y, q, cand = self.n[1:spans], self.y[1:spans], self.q[1:spans], candidate[1:spans]
        arms = []
        for side in (~cand, cand):
            cn, cy = n * side, y * side
            seen = cn > 0
            columns = (cn.sum(1), cy.sum(1), (q * side).sum(1), seen.sum(1), (cn ** 2).sum(1),
                       (np.where(seen, cy ** 2 / np.where(seen, cn, 1.0), 0.0)).sum(1),
                       (cn * history).sum(1), (cn * history ** 2).sum(1),
                       (cy * history).sum(1), (cn * unknown).sum(1),
                       (cn ** 2 * unknown).sum(1))
            arms.append([KeyedArm(int(row[0]), row[1], row[2], int(row[3]), row[4], row[5],
                                  row[6], row[7], row[8], row[9], row[10])
                         for row in zip(*(c.tolist() for c in columns), strict=True)])
        strata = tuple(zip(arms[0], arms[1], strict=True))
        if not by_key:
            return KeyedStrata.of_observations([(a.summary, b.summary) for a, b in strata])
        weighing = weigh(strata)
        return KeyedStrata(strata, None if weighing is None else
                           array_key_sums(weighing, n, y, cand, history, unknown))


def array_key_sums(weighing: Weighing, n: Floats, y: Floats, candidate: npt.NDArray[np.bool_],
                   history: Floats, unknown: Floats) -> KeySums:
    """The second pass of by_key over the cells (numpy; by_key.key_sums is its reference)."""
    rows = len(n)
    weight = np.zeros((rows, 2))
    mean = np.zeros((rows, 2))
    for j, pair in enumerate(weighing.coefficients[:rows]):
        if pair is not None:
            weight[j] = (pair[0].weight, pair[1].weight)
            mean[j] = (pair[0].mean, pair[1].mean)
    c = np.where(candidate, weight[:, 1:], weight[:, :1])
    m = np.where(candidate, mean[:, 1:], mean[:, :1])
    used = (weight[:, 0] != 0)[:, None] & (n > 0)
    loading = (c * n).sum(0)
    residual = (c * (y - weighing.history_slope * n * history - m * n)).sum(0)
    per_arm = [(n * ~candidate).sum(0), (n * candidate).sum(0)]
    return KeySums(float((loading ** 2 * unknown).sum()), float((residual ** 2).sum()),
                   int(used.any(0).sum()), int((per_arm[0] > 0).sum()),
                   int((per_arm[1] > 0).sum()), float((per_arm[0] ** 2 * unknown).sum()),
                   float((per_arm[1] ** 2 * unknown).sum()))


def simulate(design: ExperimentDesign, metrics: Sequence[OutcomeMetric], traffic: Traffic, *,
             max_looks: int, seed: int, by_key: bool = True) -> SimulatedCutover:
    """One cutover, look by look, until it decides or ``max_looks``. ``metrics``: proportions
    draw each key's own rate (the first is the decision metric's, the rest independent draws
    of the same shape), a mean draws lognormal key means. ``by_key`` False takes the
    observation as the unit, as the command did before."""
    rng = np.random.default_rng(seed)
    t = traffic
    a = t.base_rate * t.heterogeneity
    rates = rng.beta(a, t.heterogeneity - a, (len(metrics), t.keys))
    key_means = np.exp(rng.normal(0.0, 0.5, t.keys))  # a mean metric's per-key centre
    visits = 1.0 / np.arange(1, t.keys + 1) ** t.zipf
    rng.shuffle(visits)
    visits /= visits.sum()
    # Keys named afresh for each test, each sent to the candidate by its bucket, as the alias
    # sends it.
    names = rng.integers(0, 2**62, t.keys)
    buckets = np.array([key_bucket(f"/page/{name}") for name in names.tolist()])
    spans_max = max_looks + 2
    starts = np.full(spans_max, np.inf)
    percents = np.zeros(spans_max, dtype=np.int64)
    starts[0], starts[1], percents[1] = -np.inf, 0.0, design.start_percent
    spans = 2
    cells = [_Cells(spans_max, t.keys) for _ in metrics]

    def draw(to_candidate: npt.NDArray[np.bool_]) -> Floats:
        """Each metric's value of each visit whose key is ``key`` (from the loop)."""
        values = np.empty((len(metrics), len(to_candidate)))
        lift = np.where(to_candidate, t.lift, 1.0)
        for index, metric in enumerate(metrics):
            if metric.kind == Kind.MEAN:
                values[index] = rng.gamma(4.0, key_means[key] * lift / 4.0)
            else:
                rate = np.minimum(1.0, rates[index, key] * lift)
                values[index] = rng.random(len(to_candidate)) < rate
        return values

    pending: tuple[Floats, Floats, npt.NDArray[np.int64], Floats] | None = None
    served = exposed = left_out = 0
    percent = design.start_percent
    history = np.zeros((len(metrics), t.keys))
    unknown = np.ones((len(metrics), t.keys))
    if design.pre_period_s > 0 and t.history_looks:
        # Before the test the baseline served every key: each key's history then.
        key = rng.choice(t.keys, size=t.per_look * t.history_looks, p=visits)
        values = draw(np.zeros(len(key), dtype=bool))

        def per_key(weights: Floats | None = None) -> Floats:
            return np.bincount(key, weights=weights, minlength=t.keys).astype(np.float64)

        for index in range(len(metrics)):
            history[index], unknown[index] = array_key_history(
                per_key(), per_key(values[index]), per_key(values[index] ** 2))
    for look in range(1, max_looks + 1):
        key = rng.choice(t.keys, size=t.per_look, p=visits)
        at = look - 1 + rng.random(t.per_look)
        to_candidate = buckets[key] < percent
        served += t.per_look
        exposed += int(to_candidate.sum())
        values = draw(to_candidate)
        observed = at + rng.random(t.per_look) * t.max_delay_looks
        if pending is not None:  # outcomes still to be observed, from earlier looks
            at, observed = np.concatenate([pending[0], at]), np.concatenate([pending[1], observed])
            key, values = np.concatenate([pending[2], key]), np.hstack([pending[3], values])
        ready = observed <= look
        pending = (at[~ready], observed[~ready], key[~ready], values[:, ~ready])
        span, kept = credit_arrays(at[ready], observed[ready], buckets[key[ready]], starts[:spans],
                             percents[:spans], t.by_served_at,
                             design.attribution_delay_s / design.look_seconds)
        left_out += int((~kept).sum())
        for index in range(len(metrics)):
            cells[index].add(span[kept], key[ready][kept], values[index][ready][kept])
        candidate = buckets[None, :] < percents[:spans, None]
        evidence = {m.name: cells[i].strata(candidate, spans, by_key, history[i], unknown[i])
                    for i, m in enumerate(metrics)}
        elapsed = look * design.look_seconds
        result = take_look(design, metrics, evidence, percent=percent, elapsed_s=elapsed,
                           silent_s=0.0)
        if result.decision.verdict in (Verdict.PROMOTE, Verdict.ROLL_BACK):
            return SimulatedCutover(result.decision.verdict,
                                    result.decision.judgements[0].outcome, look, served,
                                    exposed, elapsed >= design.max_duration_s, left_out)
        if result.percent != percent:
            percent = result.percent
            starts[spans], percents[spans] = look, percent
            spans += 1
    return SimulatedCutover(Verdict.CONTINUE, "undecided", max_looks, served, exposed, False,
                            left_out)


def array_key_history(count: Floats, total: Floats, squares: Floats) -> tuple[Floats, Floats]:
    """by_key.key_history over per-key arrays: (shift, unknown), (0, 1) for a key never seen."""
    seen = count > 0
    n, y, q = count[seen], total[seen], squares[seen]
    shift, unknown = np.zeros(len(count)), np.ones(len(count))
    if not n.size:
        return shift, unknown
    everything = n.sum()
    mean = y.sum() / everything
    within = (q - y * y / n).sum() / (everything - n.size) if everything > n.size else 0.0
    scale = everything - (n * n).sum() / everything
    between = (max(0.0, ((y * y / n).sum() - everything * mean * mean
                         - within * (n.size - 1)) / scale) if scale > 0 else 0.0)
    signal = n * between
    known = np.where(signal + within > 0, signal / np.maximum(signal + within, 1e-300), 0.0)
    shift[seen] = known * (y / n - mean)
    unknown[seen] = 1.0 - known
    return shift, unknown


def credit_arrays(served_at: Floats, observed_at: Floats, buckets: npt.NDArray[np.int64],
                  starts: Floats, percents: npt.NDArray[np.int64], by_served_at: bool,
                  window: float) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Each observation's routing span, and whether it is credited: attribution.credit's rule,
    vectorized (span 0 is the routing before the test; every later span serves the candidate
    to the keys whose bucket is below its percent)."""
    at = served_at if by_served_at else observed_at
    span = np.searchsorted(starts, at, side="right") - 1
    kept = np.ones(len(at), dtype=bool)
    if window > 0 and not by_served_at:
        arm = buckets < percents[span]
        first = np.searchsorted(starts, observed_at - window, side="right") - 1
        for offset in range(int(np.max(span - first, initial=0))):
            index = np.minimum(first + offset, span)
            kept &= (buckets < percents[index]) == arm
    return span, kept
