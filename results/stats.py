"""Statistics of a comparison between arms: the Welch interval of a difference of means; and, for two
metrics of the same models (one per seed), the paired t interval of their per-seed differences."""

from __future__ import annotations

import math
import statistics


def welch_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(Δ, low, high) for mean(a) − mean(b), or None when either arm has < 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def minimum_detectable_effect(a: list[float], b: list[float], level: float = 0.95,
                              power: float = 0.8) -> float | None:
    """The smallest |mean(a) − mean(b)| a Welch test at ``level`` would detect with probability ``power``,
    given these seeds' spread: (t_{1−α/2, ν} + t_{power, ν}) · √(s_a²/n_a + s_b²/n_b), ν Welch's degrees of
    freedom (the normal-approximation sample-size formula with t quantiles; e.g. Cohen 1988, ch. 2).
    A tie with |Δ| below it says little: the seed count could not have told such effects from noise."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return (stats.t.ppf(0.5 + level / 2, df) + stats.t.ppf(power, df)) * se


def paired_interval(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(Δ, low, high) for the mean of d_i = a_i − b_i, pairs measured on the same model (seed i): Student's
    one-sample t interval mean(d) ± t_{1−α/2, n−1}·s_d/√n (e.g. Wasserman 2004, §10.2). None when n < 2."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one pair per seed: {len(a)} vs {len(b)}")
    if len(a) < 2:
        return None
    from scipy import stats

    d = [x - y for x, y in zip(a, b, strict=True)]
    diff, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    half = stats.t.ppf(0.5 + level / 2, len(d) - 1) * se
    return diff, diff - half, diff + half


def paired_detectable_effect(a: list[float], b: list[float], level: float = 0.95, power: float = 0.8) -> float | None:
    """The smallest |mean(a − b)| the paired t test detects with probability ``power``:
    (t_{1−α/2, n−1} + t_{power, n−1})·s_d/√n (as ``minimum_detectable_effect``, one sample of differences)."""
    if len(a) < 2:
        return None
    from scipy import stats

    d = [x - y for x, y in zip(a, b, strict=True)]
    return (stats.t.ppf(0.5 + level / 2, len(d) - 1) + stats.t.ppf(power, len(d) - 1)) * statistics.stdev(d) / \
        math.sqrt(len(d))
