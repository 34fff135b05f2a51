"""Few keys (pure): the always-valid test's variance, estimated from the keys, is itself a
random draw with as many degrees of freedom as there are keys, so with a handful of keys per
arm its plug-in interval is too narrow (#61 path 2: 11 % false decisions with two keys per arm
at alpha 5 %).

The interval is widened as Student's t widens the normal's: at each look the mixture boundary
sits ``b`` standard errors from the estimate; it moves to the point of Student's t with the
estimate's degrees of freedom that leaves the same tail, ``t_df^-1(Phi(b))``. The degrees of
freedom are Welch and Satterthwaite's, from each arm's variance and keys. With fewer than
:data:`MIN_KEYS_PER_ARM` keys on an arm nothing is judged.

Matching t's tail at the mixture's far boundary over-corrects once the keys are a few dozen:
the mixture's boundary is itself conservative, and A/A tests with the plain normal already
decide falsely at most 1.2 % of the time from 8 keys an arm (alpha 5 %). Yet the full t
correction still widens the interval by 1 % at 200 keys an arm, which cost promotions at 400
keys. So the widening fades, in logarithm linearly, to none at :data:`NORMAL_FROM_DF` degrees
of freedom: continuous, no step where it ends. The A/A simulations of ``bench/outcomes.py
--only few_keys`` show the false decisions this leaves, at most alpha (docs/cutover.md)."""

from __future__ import annotations

import math

# Below this many keys on an arm there is no spread between keys to estimate from.
MIN_KEYS_PER_ARM = 2
# From this many degrees of freedom on, the boundary is the normal's (about 11 keys an arm).
NORMAL_FROM_DF = 20.0


def welch_df(arm_variances: tuple[float, float], keys: tuple[int, int]) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two arms' means whose
    variances come from ``keys`` keys each; 0 (nothing to judge) below MIN_KEYS_PER_ARM keys
    on an arm or when an arm's variance is unknown, inf when neither arm's mean varies."""
    (vb, vc), (kb, kc) = arm_variances, keys
    if min(kb, kc) < MIN_KEYS_PER_ARM or not all(math.isfinite(v) for v in (vb, vc)):
        return 0.0
    spread = vb * vb / (kb - 1) + vc * vc / (kc - 1)
    return math.inf if spread <= 0 else (vb + vc) ** 2 / spread


def widening(boundary: float, df: float) -> float:
    """How much wider an interval whose edge is ``boundary`` standard errors out is made with
    ``df`` degrees of freedom: as much as Student's t needs to leave the tail that the normal
    leaves there, faded (as a power) to none at NORMAL_FROM_DF."""
    fade = 1.0 - df / NORMAL_FROM_DF
    if fade <= 0 or boundary <= 0:
        return 1.0
    tail = 0.5 * math.erfc(boundary / math.sqrt(2.0))  # P(Z > boundary)
    return float((t_quantile_above(tail, df) / boundary) ** fade)


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t >= 0."""
    x = df / (df + t * t)
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, x)


def t_quantile_above(tail: float, df: float) -> float:
    """The t with P(T > t) = ``tail`` (0 < tail < 0.5), by bisection on :func:`t_tail`."""
    low, high = 0.0, 1.0
    while t_tail(high, df) > tail:
        low, high = high, high * 2.0
        if high > 1e12:
            return math.inf
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_tail(middle, df) > tail:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return 0.5 * (low + high)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _fraction(a, b, x) / a
    return 1.0 - front * _fraction(b, a, 1.0 - x) / b


def _fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result
