"""Intervals and verdicts: a target is met only when its whole 95 % interval is on the right side of the goal.

A ratio of step times is judged by its median over rounds r_1 … r_n (back-to-back pairs, so drift in the
machine's speed cancels within one), with the distribution-free 95 % interval [r_(k), r_(n+1−k)] of the
sorted rounds, k the largest rank with P(Binomial(n, ½) < k) ≤ 2.5 % (order statistics: no assumption
about the rounds' distribution, so at least ``MIN_ROUNDS`` = 6 rounds). Not the mean: noise on a shared
machine is one-sided and heavy-tailed (a step while malloc's heap is still growing, another tenant's load:
a few slow rounds, never fast ones), and a t interval on log ratios takes such rounds as spread and shift.
A deterministic measure (bytes of allocated tensors) is a point: an interval of width 0.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["met", "not met", "unresolved", "not measured"]
MIN_ROUNDS = 6  # the fewest samples whose [min, max] covers their median with probability ≥ 95 % (1 − 2/2⁶)


def median_rank(n: int) -> int:
    """The largest k with P(Binomial(n, ½) ≤ k − 1) ≤ 2.5 %: [x_(k), x_(n+1−k)] of n sorted samples covers
    their median with probability ≥ 95 %, whatever their distribution (0: no such k, n < 6). It is the
    distribution's 2.5 % quantile: the smallest k with P(Binomial(n, ½) ≤ k) ≥ 2.5 % (never equal: those
    probabilities are multiples of 2⁻ⁿ)."""
    from scipy import stats

    return int(stats.binom.ppf(0.025, n, 0.5))


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95 % interval [low, high] and the samples behind it (empty for a point)."""

    estimate: float
    low: float
    high: float
    samples: tuple[float, ...] = ()

    @classmethod
    def point(cls, value: float) -> Interval:
        return cls(value, value, value)

    @classmethod
    def of_ratios(cls, ratios: list[float]) -> Interval:
        """The median of the rounds with its distribution-free 95 % interval (n ≥ ``MIN_ROUNDS``)."""
        k = median_rank(len(ratios))
        if k == 0:
            raise ValueError(f"{len(ratios)} rounds: a 95 % interval of the median needs {MIN_ROUNDS} or more")
        ordered = sorted(ratios)
        return cls(statistics.median(ordered), ordered[k - 1], ordered[-k], tuple(ratios))

    @classmethod
    def of_values(cls, values: list[float]) -> Interval:
        """Arithmetic mean with its t interval (n ≥ 2), for values that may be ≤ 0 (an overhead)."""
        from scipy import stats

        mean = statistics.fmean(values)
        half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        return cls(mean, mean - half, mean + half, tuple(values))

    def map(self, f) -> Interval:
        """The interval of an increasing function of the quantity (e.g. ratio − 1)."""
        return Interval(f(self.estimate), f(self.low), f(self.high), self.samples)


@dataclass(frozen=True)
class Goal:
    """``value op goal``: op "<=" (at most) or ">=" (at least); ``percent`` formats as a percentage."""

    op: Literal["<=", ">="]
    value: float
    percent: bool = False

    def __str__(self) -> str:
        return f"{'≤' if self.op == '<=' else '≥'} {self.format(self.value)}"

    def format(self, x: float) -> str:
        return f"{x:.1%}" if self.percent else f"{x:.2f}"

    def judge(self, interval: Interval) -> Verdict:
        """met: the whole interval satisfies the goal; not met: none of it does; unresolved: it straddles."""
        good, bad = (interval.high, interval.low) if self.op == "<=" else (interval.low, interval.high)
        if self._holds(good):
            return "met"
        return "not met" if not self._holds(bad) else "unresolved"

    def resolved(self, interval: Interval) -> bool:
        return self.judge(interval) != "unresolved"

    def _holds(self, x: float) -> bool:
        return x <= self.value if self.op == "<=" else x >= self.value
