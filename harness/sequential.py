"""Comparisons decided in stages of seeds: a group-sequential design whose family-wise error stays ≤ α.

A sweep compares each arm with its baseline on per-seed values (a final val loss). Each comparison holds
hypotheses declared before the results: *difference* (Welch's two-sided t test of Δ = 0; rejected: ``lower`` or
``higher``) and, where a margin m was declared, *equivalence* (two one-sided Welch tests of |Δ| ≥ m, Schuirmann 1987;
rejected: ``equivalent``); a paper's claim that two arms agree within ±m holds equivalence and *beyond* (|Δ| ≤ m,
tested on both sides at the margin; rejected: ``beyond``, the difference shown outside it) instead. None rejected:
``inconclusive`` — non-rejection is never read as a tie.

The family: every hypothesis of every comparison, decided by Holm's step-down procedure (Holm 1979) — a hypothesis
is tested at α / (the family's hypotheses not yet rejected) and the level of the rest rises as hypotheses fall.
Looks: seeds per arm at each look, ``stage``, 2·``stage`` … up to ``most``. At look k a test at level a rejects when
its p-value is at most the nominal level of a Lan–DeMets α-spending boundary at level a (Lan & DeMets 1983; the
O'Brien–Fleming-type spending α(t) = 2 − 2Φ(z_{1−α/2} / √t) or the Pocock-type α(t) = α·ln(1 + (e − 1)·t), t the
look's share of ``most``) — Holm's procedure run with group-sequential tests, whose family-wise error is ≤ α
(Maurer & Bretz 2013, "Multiple testing in group sequential trials using graphical approaches"). With one look
(``stage == most``: a fixed number of seeds) the boundary is the plain level and this is Holm's procedure itself.

A comparison stops taking seeds once it is decided, when even ``most`` seeds could not decide it if the effect and
spread are as measured (futility at 80 % power), or when every seed of one side failed (no value to compare);
stopping early can only make fewer rejections, so the error rate holds. Student-t p-values against boundaries
derived for normal statistics are an approximation at a few seeds; ``tests/unit/test_sequential.py`` measures the
family-wise error by simulation, through this code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

import numpy as np

from harness.stats import sample_variance, t_sf, welch, welch_p_value

Spending = Literal["obrien-fleming", "pocock"]
POWER = 0.8  # futility: a comparison stops when more seeds would decide it with less than this power
FUTILITY_Z = 1.2816  # z_0.9: futility reads the difference at the edge of its 80 % interval that favours deciding
GRID = 601  # points of the numerical integration on each look's continuation region


@dataclass(frozen=True)
class Design:
    """How many seeds each arm gets and when the family is judged, declared before any result."""

    alpha: float = 0.05  # the family-wise level
    stage: int = 3  # seeds per arm at the first look, and added at each later look
    most: int = 3  # seeds per arm at the last look; most == stage: one look (a fixed number of seeds)
    spending: Spending = "obrien-fleming"
    margin: float | None = None  # equivalence margin (the metric's units); None: no equivalence test

    def comparison(self, arm: str, baseline: str, a: list[float] | None = None, b: list[float] | None = None):
        """A sweep's comparison of ``arm`` with ``baseline``: difference, and equivalence with the design's margin."""
        kinds = ("difference", "equivalence") if self.margin is not None else ("difference",)
        return Comparison(arm, baseline, a or [], b or [], kinds, self.margin)

    @property
    def looks(self) -> tuple[int, ...]:
        """Seeds per arm at each look, e.g. stage 3, most 10: (3, 6, 9, 10)."""
        return (*range(self.stage, self.most, self.stage), self.most)

    def nominal(self, level: float, look: int, sides: int) -> float:
        """The p-value at or below which a test at ``level`` rejects at look ``look`` (0-based), ``sides`` 2 for a
        two-sided p, 1 for a one-sided one."""
        fractions = tuple(n / self.most for n in self.looks)
        return sides * t_sf(critical_values(level, fractions, sides, self.spending)[look], math.inf)


def spent(alpha: float, t: float, spending: Spending) -> float:
    """α spent by information fraction ``t`` (Lan & DeMets 1983)."""
    from scipy.stats import norm

    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    return float(2 * norm.sf(norm.isf(alpha / 2) / math.sqrt(t))) if t > 0 else 0.0


@functools.lru_cache(maxsize=4096)
def critical_values(alpha: float, fractions: tuple[float, ...], sides: int, spending: Spending) -> tuple[float, ...]:
    """The boundary c_k on the standard-normal statistic Z_k at each look: the test rejects at the first k with
    Z_k ≥ c_k (``sides`` 1) or |Z_k| ≥ c_k (2), and under the null the chance of a first crossing at look k is
    spent(t_k) − spent(t_{k−1}). Z_k √t_k is a sum of independent N(0, t_j − t_{j−1}) increments, so the density
    of that sum over the paths not yet stopped is carried from look to look by numerical integration on a grid
    (Jennison & Turnbull 2000, ch. 19)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    values: list[float] = []
    points = weights = density = np.zeros(0)
    before = 0.0
    for k, t in enumerate(fractions):
        target = spent(alpha, t, spending) - (spent(alpha, fractions[k - 1], spending) if k else 0.0)
        step = math.sqrt(t - before)
        carried = (t, step, points, weights * density, sides, target)
        if target <= 0:
            c = math.inf
        elif k == 0:
            c = float(norm.isf(target / sides))
        else:
            c = brentq(_crossing, 0.0, 40.0, args=carried) if _crossing(0.0, *carried) > 0 else math.inf
        values.append(c)
        # the density of Z_k √t_k on the paths still running after look k, on a grid with Simpson's weights
        top = min(c, 12.0) * math.sqrt(t)
        new_points = np.linspace(-top if sides == 2 else -12.0 * math.sqrt(t), top, GRID)
        if k == 0:
            density = norm.pdf(new_points, scale=step)
        else:
            density = (norm.pdf((new_points[:, None] - points[None, :]) / step) / step) @ (weights * density)
        points, weights, before = new_points, _simpson(new_points), t
    return tuple(values)


def _crossing(c, t, step, points, mass, sides, target) -> float:
    """The chance that a path still running crosses ±c at information t, less the α to be spent there."""
    from scipy.stats import norm

    upper = norm.sf((c * math.sqrt(t) - points) / step)
    lower = norm.cdf((-c * math.sqrt(t) - points) / step) if sides == 2 else 0.0
    return float(np.sum(mass * (upper + lower))) - target


def _simpson(x: np.ndarray) -> np.ndarray:
    h = (x[-1] - x[0]) / (len(x) - 1)
    w = np.ones(len(x))
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3


# ---------------------------------------------------------------- one comparison's tests


def equivalence_p(a: list[float], b: list[float], margin: float) -> float:
    """The two one-sided Welch tests' p of |Δ| ≥ margin (the larger of the p of Δ ≤ −m and of Δ ≥ +m): small when
    the difference is shown inside ±margin. No spread: 0 if |Δ| < margin, else 1."""
    diff, se, df = welch(a, b)
    if se == 0:
        return 0.0 if abs(diff) < margin else 1.0
    return max(t_sf((diff + margin) / se, df), t_sf((margin - diff) / se, df))


def beyond_p(a: list[float], b: list[float], margin: float) -> float:
    """The p of |Δ| ≤ margin against |Δ| > margin: Welch's one-sided p of Δ̂ past the margin on its own side, doubled
    for the side read from the data (a level-α test, conservative when the margin is many standard errors wide):
    small when the difference is shown outside ±margin. No spread: 0 if |Δ| > margin, else 1."""
    diff, se, df = welch(a, b)
    if se == 0:
        return 0.0 if abs(diff) > margin else 1.0
    return min(1.0, 2 * t_sf((abs(diff) - margin) / se, df))


def _seeds_to_decide(a: list[float], b: list[float], effect: float, level: float, sides: int, most: int) -> int | None:
    """Seeds per arm (the same on both sides) with which a test at ``level`` shows ``effect`` with 80 % power if the
    seeds spread as these do: the least n with (z_{1−level/sides} + z_{power})·√((s_a² + s_b²)/n) ≤ effect (the
    normal approximation); None when more than ``most`` would be needed or there is no effect to show."""
    if effect <= 0:
        return None
    spread = sample_variance(a) + sample_variance(b)
    z = NormalDist().inv_cdf  # the standard normal's quantiles, -z(p) its upper ones
    n = math.ceil(spread * ((z(level / sides) + z(1 - POWER)) / effect) ** 2)
    return max(n, 2) if n <= most else None


# ---------------------------------------------------------------- the family, look by look


SIDES = {"difference": 2, "equivalence": 1, "beyond": 2}  # each hypothesis's p: two- or one-sided (its boundary)


@dataclass
class Comparison:
    """One arm (``a``) against its baseline (``b``): its hypotheses, the per-seed values so far and what the family
    decided."""

    arm: str
    baseline: str = ""
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    kinds: tuple[str, ...] = ("difference",)  # its hypotheses (SIDES' keys)
    margin: float | None = None  # for equivalence and beyond: ±margin in the values' units
    rejected: dict[str, int] = field(default_factory=dict)  # hypothesis -> the look at which it was rejected
    futile_at: int | None = None  # the look after which more seeds could not decide it (or the last look)

    @property
    def running(self) -> bool:
        """Still taking seeds: no hypothesis rejected, not stopped for futility."""
        return not self.rejected and self.futile_at is None

    @property
    def verdict(self) -> str:
        """lower | higher | equivalent | beyond | inconclusive, or running while it takes seeds."""
        if "difference" in self.rejected:
            return "lower" if welch(self.a, self.b)[0] < 0 else "higher"
        if self.rejected:
            return "equivalent" if "equivalence" in self.rejected else "beyond"
        return "running" if self.running else "inconclusive"

    @property
    def decided_at(self) -> int | None:
        """The look that ended it: a hypothesis rejected, futility, or the last look."""
        looks = [*self.rejected.values(), *([] if self.futile_at is None else [self.futile_at])]
        return min(looks) if looks else None


def judge(family: list[Comparison], design: Design, look: int) -> None:
    """Look ``look`` (0-based) at the comparisons still running, each holding that look's seeds (≥ 2 a side):
    Holm's step-down over the family's hypotheses not yet rejected, each test against its group-sequential boundary
    at its current level; then the last look closes what is undecided, and an earlier one stops what more seeds
    could not decide (futility) or where one side has no value (every seed of it failed)."""
    looking = [c for c in family if c.running and min(len(c.a), len(c.b)) >= 2]  # fewer: failed seeds, no test yet
    while True:
        open_ = [(c, kind) for c in family for kind in c.kinds if kind not in c.rejected]
        level = design.alpha / max(1, len(open_))
        rejected = [
            (c, kind) for c, kind in open_ if c in looking and _p(c, kind) <= design.nominal(level, look, SIDES[kind])
        ]
        if not rejected:
            break
        for c, kind in rejected:
            c.rejected[kind] = look
    for c in (c for c in family if c.running):
        # a side with no value: every seed of it failed (a refused pairing fails alike on each seed it is given)
        if look == len(design.looks) - 1 or not (c.a and c.b) or (c in looking and not _decidable(c, design, level)):
            c.futile_at = look


def _decidable(c: Comparison, design: Design, level: float) -> bool:
    """Whether ``most`` seeds could decide ``c`` at ``level`` (the most its tests get while nothing else is
    rejected) for a difference as favourable as the measured one's 80 % interval allows, at the measured spread."""
    diff, se, _ = welch(c.a, c.b)
    reach, margin = FUTILITY_Z * se, c.margin or 0.0
    closest = max(0.0, abs(diff) - reach)
    effects = {  # the distance each hypothesis needs shown, at its most favourable
        "difference": abs(diff) + reach,
        "equivalence": margin - closest,
        "beyond": abs(diff) + reach - margin,
    }
    return any(_seeds_to_decide(c.a, c.b, effects[k], level, SIDES[k], design.most) is not None for k in c.kinds)


def _p(c: Comparison, kind: str) -> float:
    """The p-value of ``c``'s hypothesis ``kind``; each side holds ≥ 2 values here."""
    if kind == "difference":  # Welch's two-sided p of Δ = 0 (harness/stats.py)
        p = welch_p_value(c.a, c.b)
        return 1.0 if p is None else p
    return equivalence_p(c.a, c.b, c.margin or 0.0) if kind == "equivalence" else beyond_p(c.a, c.b, c.margin or 0.0)


def settle(
    pairs: list[tuple[str, str]] | list[Comparison],
    design: Design,
    draw: Callable[[dict[str, int]], dict[str, list[float]]],
    stop: Callable[[Comparison, int], bool] | None = None,
) -> list[Comparison]:
    """Each comparison decided look by look, as one family: ``pairs`` are (arm, baseline) names, each compared on
    difference and, with the design's margin, equivalence (or comparisons with hypotheses of their own). ``draw``
    gets the seeds each arm needs at a look (the arms of the comparisons still running and their baselines: the
    first n seeds) and returns each one's per-seed values among those seeds (a sweep trains the seeds it lacks and
    reads their values; a failed seed has none); returns the family, each comparison decided. ``stop(c, n)``: a
    comparison more seeds cannot help at n seeds (a claim's arm not yet using word order) ends at that look,
    undecided; its hypotheses stay in Holm's count."""
    family = [p if isinstance(p, Comparison) else design.comparison(*p) for p in pairs]
    for look, n in enumerate(design.looks):
        running = [c for c in family if c.running]
        if not running:
            break
        values = draw({name: n for c in running for name in (c.arm, c.baseline)})
        for c in running:
            c.a, c.b = values[c.arm], values[c.baseline]
            if stop is not None and stop(c, n):
                c.futile_at = look
        judge(family, design, look)
    return family
