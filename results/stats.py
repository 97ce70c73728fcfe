"""Statistics of a comparison between arms: the Welch interval of a difference of means."""

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
