"""Statistics of a comparison between arms: the Welch interval of a difference of means; and, for two
metrics of the same models (one per seed), the paired t interval of their per-seed differences.

Each is a t test's terms (Δ, its standard error, the degrees of freedom: ``welch``, ``_paired``), from which its
interval, the smallest effect it detects and its p-value follow alike."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

Terms = tuple[float, float, float]  # (Δ, its standard error, the t statistic's degrees of freedom)


def sample_variance(x: list[float]) -> float:
    """s² in plain floats: fast where a simulation computes it many times (``statistics.variance`` is exact)."""
    mean = math.fsum(x) / len(x)
    return math.fsum((v - mean) ** 2 for v in x) / (len(x) - 1)


def welch(a: list[float], b: list[float], variance: Callable[[list[float]], float] = sample_variance) -> Terms:
    """(Δ = mean(a) − mean(b), its standard error, Welch's degrees of freedom: ∞ without spread); each side needs ≥ 2
    values. Plain floats by default: harness/sequential.py calls it in its simulations' inner loop."""
    va, vb = variance(a) / len(a), variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else math.inf
    return statistics.fmean(a) - statistics.fmean(b), se, df


def _exact_welch(a: list[float], b: list[float]) -> Terms | None:
    """``welch`` with exact variances, for what a report prints; None when either arm has < 2 values."""
    return welch(a, b, statistics.variance) if len(a) >= 2 and len(b) >= 2 else None


def _paired(a: list[float], b: list[float]) -> Terms | None:
    """(mean of d_i = a_i − b_i, its standard error s_d/√n, n − 1), pairs measured on the same model (seed i): the
    one-sample t test's terms; None when n < 2."""
    if len(a) < 2:
        return None
    d = [x - y for x, y in zip(a, b, strict=True)]
    return statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)), len(d) - 1


def t_sf(x: float, df: float) -> float:
    """Student's t survival function (scipy's ``stdtr``, a ufunc: fast for one value); df = ∞: the normal's."""
    from scipy.special import stdtr

    return float(stdtr(df, -x)) if math.isfinite(df) else 0.5 * math.erfc(x / math.sqrt(2))


def _interval(terms: Terms | None, level: float) -> tuple[float, float, float] | None:
    """(Δ, low, high): Δ ± t_{1−α/2, df}·se."""
    if terms is None:
        return None
    from scipy import stats

    diff, se, df = terms
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def _detectable(terms: Terms | None, level: float, power: float) -> float | None:
    """(t_{1−α/2, df} + t_{power, df})·se: the smallest |Δ| the test detects with probability ``power``."""
    if terms is None:
        return None
    from scipy import stats

    _, se, df = terms
    return (stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df)) * se


def _p_value(terms: Terms | None) -> float | None:
    """Two-sided p of the t test of Δ = 0. No spread: 0 if Δ ≠ 0, else 1."""
    if terms is None:
        return None
    diff, se, df = terms
    if se == 0:
        return 0.0 if diff else 1.0
    return min(1.0, 2 * t_sf(abs(diff) / se, df))


def welch_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(Δ, low, high) for mean(a) − mean(b), or None when either arm has < 2 values."""
    return _interval(_exact_welch(a, b), level)


def minimum_detectable_effect(a: list[float], b: list[float], level: float = 0.95, power: float = 0.8) -> float | None:
    """The smallest |mean(a) − mean(b)| a Welch test at ``level`` would detect with probability ``power``,
    given these seeds' spread: (t_{1−α/2, ν} + t_{power, ν}) · √(s_a²/n_a + s_b²/n_b), ν Welch's degrees of
    freedom (the normal-approximation sample-size formula with t quantiles; e.g. Cohen 1988, ch. 2).
    A tie with |Δ| below it says little: the seed count could not have told such effects from noise."""
    return _detectable(_exact_welch(a, b), level, power)


def welch_p_value(a: list[float], b: list[float]) -> float | None:
    """Two-sided p of Welch's t test of mean(a) = mean(b) (the test ``welch_interval`` inverts), or None when either
    arm has < 2 values. No spread on either side: 0 if the means differ, else 1."""
    return _p_value(welch(a, b) if len(a) >= 2 and len(b) >= 2 else None)


def seeds_needed(
    a: list[float], b: list[float], effect: float, level: float = 0.95, power: float = 0.8, most: int = 1000
) -> int | None:
    """The seeds per arm (the same n on both sides) at which a Welch test at ``level`` would detect a difference of
    ``effect`` with probability ``power``, if the seeds spread as these do: the least n with
    (t_{1−α/2, ν} + t_{power, ν})·√((s_a² + s_b²)/n) ≤ |effect|, ν = 2(n − 1) (``minimum_detectable_effect`` solved
    for n). None when either arm has < 2 values, there is no spread or no effect, or more than ``most`` are needed."""
    if len(a) < 2 or len(b) < 2 or not effect:
        return None
    from scipy import stats

    spread = statistics.variance(a) + statistics.variance(b)
    if spread == 0:
        return None
    for n in range(2, most + 1):
        df = 2 * (n - 1)
        if (stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df)) * math.sqrt(spread / n) <= abs(effect):
            return n
    return None


def what_settles(a: list[float], b: list[float], diff: float, per: str = "arm") -> str:
    """``; n ≥ K per arm would detect |Δ| = …`` (``seeds_needed``), for a comparison that did not settle; "" when
    there is no difference to detect."""
    if not diff:
        return ""
    n = seeds_needed(a, b, diff)
    return (
        f"; n ≥ {n} per {per} would detect |Δ| = {abs(diff):.4f}"
        if n
        else f"; more than 1000 seeds per {per} would be needed for |Δ| = {abs(diff):.4f}"
    )


def paired_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(Δ, low, high) for the mean of d_i = a_i − b_i, pairs measured on the same model (seed i): Student's
    one-sample t interval mean(d) ± t_{1−α/2, n−1}·s_d/√n (e.g. Wasserman 2004, §10.2). None when n < 2."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one pair per seed: {len(a)} vs {len(b)}")
    return _interval(_paired(a, b), level)


def paired_detectable_effect(a: list[float], b: list[float], level: float = 0.95, power: float = 0.8) -> float | None:
    """The smallest |mean(a − b)| the paired t test detects with probability ``power``:
    (t_{1−α/2, n−1} + t_{power, n−1})·s_d/√n (as ``minimum_detectable_effect``, one sample of differences)."""
    return _detectable(_paired(a, b), level, power)


def paired_p_value(a: list[float], b: list[float]) -> float | None:
    """Two-sided p of the paired t test of mean(a − b) = 0 (the test ``paired_interval`` inverts); None if n < 2."""
    return _p_value(_paired(a, b))


def holm(pvalues: list[float], alpha: float) -> list[bool]:
    """Which hypotheses of a family Holm's step-down procedure rejects at family-wise level ``alpha`` (Holm 1979):
    with the p-values in ascending order p_(1) ≤ … ≤ p_(m), reject H_(k) while p_(k) ≤ α / (m − k + 1), and stop at
    the first that is not. Returned in the input's order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    stop = next((k for k, i in enumerate(order) if pvalues[i] > alpha / (len(pvalues) - k)), len(pvalues))
    return [i in order[:stop] for i in range(len(pvalues))]
