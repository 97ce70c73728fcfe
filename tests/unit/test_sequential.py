"""The group-sequential design (harness/sequential.py): its boundaries against an independent computation, its
family decisions against Holm's procedure, and its family-wise error, power and seeds measured by simulation."""

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from harness.sequential import Comparison, Design, critical_values, judge, settle, spent
from harness.stats import holm, welch_p_value

FRACTIONS = (0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Simulated:
    """What a design does to experiments drawn from known normal arms (``simulate``)."""

    false_claims: float  # share of experiments with any false claim: the family-wise error
    decided: float  # share of comparisons decided (lower, higher or equivalent)
    seeds: float  # mean seeds per arm


def simulate(
    design: Design, means: list[float], sds: list[float], reps: int, seed: int = 0, agreement: bool = False
) -> Simulated:
    """``reps`` experiments through the decision code (``settle``), arm i's per-seed values drawn from
    N(means[i], sds[i]²), arm 0 the baseline; ``agreement``: each comparison is a claim that the arms agree within
    the margin (equivalence and beyond), else a sweep's (difference, and equivalence with a margin). A false claim:
    lower/higher where the means are equal or in the wrong direction, equivalent where |Δ| ≥ the margin, beyond
    where |Δ| ≤ it."""
    rng = np.random.default_rng(seed)
    arms = [str(i) for i in range(len(means))]
    false = decided = seeds = 0
    for _ in range(reps):
        pool = {a: rng.normal(means[i], sds[i], design.most).tolist() for i, a in enumerate(arms)}
        taken = dict.fromkeys(arms, 0)

        def draw(need: dict[str, int], pool=pool, taken=taken) -> dict[str, list[float]]:
            taken.update({a: max(taken[a], n) for a, n in need.items()})
            return {a: pool[a][:n] for a, n in need.items()}

        kinds = ("equivalence", "beyond")
        pairs = [Comparison(a, "0", kinds=kinds, margin=design.margin) if agreement else (a, "0") for a in arms[1:]]
        family = settle(pairs, design, draw)
        seeds += sum(taken.values())
        decided += sum(c.verdict != "inconclusive" for c in family)
        false += any(_false(c.verdict, means[int(c.arm)] - means[0], design.margin) for c in family)
    return Simulated(false / reps, decided / (reps * len(family)), seeds / (reps * len(arms)))


def _false(verdict: str, true_diff: float, margin: float | None) -> bool:
    if verdict in ("lower", "higher"):
        return true_diff == 0 or (verdict == "lower") != (true_diff < 0)
    if verdict == "beyond":
        return margin is None or abs(true_diff) <= margin
    return verdict == "equivalent" and (margin is None or abs(true_diff) >= margin)


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
@pytest.mark.parametrize("sides", [1, 2])
def test_each_boundary_spends_what_its_function_says(spending, sides):
    """The chance of no crossing by look k is the multivariate normal probability of the box |Z_j| < c_j (Z_j with
    correlations √(t_i / t_j)): computed here by scipy's Genz integration, independent of the grid recursion."""
    c = np.array(critical_values(0.05, FRACTIONS, sides, spending))
    t = np.array(FRACTIONS)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for k in range(1, len(t) + 1):
        box = multivariate_normal(np.zeros(k), cov[:k, :k], abseps=1e-7, releps=1e-7, maxpts=10**6)
        lower = -c[:k] if sides == 2 else np.full(k, -np.inf)
        crossed = 1 - box.cdf(c[:k], lower_limit=lower, rng=np.random.default_rng(0))
        assert crossed == pytest.approx(spent(0.05, t[k - 1], spending), abs=2e-6)


def test_pocock_type_spending_gives_its_published_near_constant_boundaries():
    """Lan–DeMets' Pocock-type spending at five equal looks, two-sided α = 0.05: 2.438, 2.427, 2.410, 2.397, 2.386
    (as tabulated for this spending function, e.g. by R's ldbounds / gsDesign)."""
    c = critical_values(0.05, FRACTIONS, 2, "pocock")
    assert c == pytest.approx((2.438, 2.427, 2.410, 2.397, 2.386), abs=1e-3)


def test_one_look_is_the_plain_level_and_the_looks_follow_the_stage():
    assert Design(stage=3, most=10).looks == (3, 6, 9, 10) and Design(stage=5, most=5).looks == (5,)
    for level in (0.05, 0.01, 0.0125):
        assert Design(stage=4, most=4).nominal(level, 0, 2) == pytest.approx(level, rel=1e-12)
        assert Design(stage=4, most=4).nominal(level, 0, 1) == pytest.approx(level, rel=1e-12)
    early, last = (Design(stage=3, most=9).nominal(0.05, k, 2) for k in (0, 2))
    assert early < 0.002 and 0.04 < last < 0.05  # O'Brien–Fleming: strict early, near α at the end


def test_one_look_without_a_margin_is_holms_procedure():
    rng = np.random.default_rng(3)
    base = rng.normal(0, 1, 5).tolist()
    arms = [rng.normal(shift, 1, 5).tolist() for shift in (-6.0, -3.0, -2.0, 0.0, 0.4)]
    family = [Comparison(str(i), "base", a, base) for i, a in enumerate(arms)]
    judge(family, Design(alpha=0.05, stage=5, most=5), 0)
    rejected = holm([welch_p_value(a, base) or 1.0 for a in arms], 0.05)
    assert [c.verdict in ("lower", "higher") for c in family] == rejected
    assert {c.verdict for c in family} <= {"lower", "higher", "inconclusive"} and 0 < sum(rejected) < len(arms)


def test_a_difference_and_its_equivalence_can_both_fall_at_one_look():
    """Many seeds, a difference of 0.01 with a spread of 0.001: different, and within ±0.05 — lower, negligible."""
    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.001, 20).tolist()
    design = Design(stage=20, most=20, margin=0.05)
    c = design.comparison("a", "base", rng.normal(0.99, 0.001, 20).tolist(), base)
    judge([c], design, 0)
    assert c.verdict == "lower" and c.rejected == {"difference": 0, "equivalence": 0}


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
@pytest.mark.parametrize("arms", [2, 5, 10])
def test_the_family_wise_error_stays_within_alpha_with_unequal_spreads(spending, arms):
    """No arm differs from the baseline; the spreads differ by up to 4×. Looks at 3, 6 and 9 seeds. The share of
    experiments with any false "lower"/"higher" stays ≤ α within three Monte-Carlo standard errors."""
    reps, alpha = 1000, 0.05
    sds = [1.0] + [0.5 + 1.5 * i / max(1, arms - 1) for i in range(arms)]
    found = simulate(Design(alpha, 3, 9, spending), [0.0] * (arms + 1), sds, reps, seed=arms)
    assert found.false_claims <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    assert 3 <= found.seeds <= 9


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
def test_a_false_equivalence_is_as_rare(spending):
    """Every arm lies exactly at the margin (|Δ| = m, equivalence false): any "equivalent" is a false claim."""
    reps, alpha = 1000, 0.05
    found = simulate(Design(alpha, 3, 9, spending, margin=0.5), [0.0, 0.5, -0.5, 0.5], [1.0] * 4, reps, seed=7)
    assert found.false_claims <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
def test_a_claim_of_agreement_errs_as_rarely_at_the_margin_and_decides_both_ways(spending):
    """A paper's "A ≈ B within ±m" (equivalence and beyond, two hypotheses each): with every arm exactly at the
    margin both are false, and any decision is a false claim; far inside it is decided equivalent, far outside
    beyond, each with seeds to spare."""
    reps, alpha = 1000, 0.05
    design = Design(alpha, 3, 9, spending, margin=0.5)
    at = simulate(design, [0.0, 0.5, -0.5, 0.5], [1.0] * 4, reps, seed=11, agreement=True)
    assert at.false_claims <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    inside = simulate(design, [0.0, 0.0, 0.0], [0.1] * 3, 200, seed=12, agreement=True)
    outside = simulate(design, [0.0, 2.0, -2.0], [0.3] * 3, 200, seed=13, agreement=True)
    for found in (inside, outside):
        assert found.decided > 0.9 and found.false_claims < 0.02 and found.seeds <= 6  # of at most 9


def test_a_large_effect_stops_at_the_first_look_and_a_small_one_takes_more_seeds():
    """Pocock's boundary spends early: an effect of 8 standard deviations is decided with the first 3 seeds in
    most experiments (Welch's t at 3 seeds a side has about 4 degrees of freedom, so even a large effect needs a
    clear margin); one of 1.5 takes more seeds on average, and is decided more often than not by 9."""
    design = Design(0.05, 3, 9, "pocock")
    large = simulate(design, [0.0, -8.0, -8.0], [1.0] * 3, 400, seed=1)
    small = simulate(design, [0.0, -1.5, -1.5], [1.0] * 3, 400, seed=2)
    assert large.decided > 0.95 and large.seeds < 3.5
    assert small.seeds > 5 and small.decided > 0.5
    assert large.false_claims == small.false_claims == 0.0  # a wrong-direction call at these effects: never here
