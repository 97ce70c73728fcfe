"""Every sweep report's answer: does each scheme beat the baseline beyond seed noise, and can the models tell?

Within one attention (and variant: the other swept overrides, e.g. ``task=copy``), each scheme's
per-seed final val loss is compared with a baseline's, named before the results are seen: ``report.baseline``
(recorded on the sweep's parent run when it starts), else ``pos=none`` when the sweep has it (what the scheme adds
over no position information). Never the best-looking scheme: a baseline picked from the results compares every
scheme with the winner, and the direction of each comparison would flip with the outcome. A sweep with neither
gets no verdict, and one line asking for ``report.baseline``. Each comparison gets one verdict:

  premature   the scheme's models do not use word order yet (order gain < report.min_order_gain, see
              results/cells.py): its loss says nothing about its positional scheme — train longer; how
              much longer comes from its own order-gain curve (``trend``)
  lower / higher   Welch's t test of the difference rejects after Holm's correction over the sweep's
              hypotheses (the family: every comparison with two seeds a side) at family-wise level report.alpha
              (0.05; recorded when the sweep starts): a grid of 32 comparisons at 95 % each would call
              one or two "beyond noise" by chance alone
  equivalent  the two one-sided tests show |Δ| < report.margin, the margin declared (and recorded) before the
              sweep ran; each comparison's equivalence is a hypothesis of the same Holm family
  inconclusive  neither rejects: no evidence either way, never read as a tie; the minimum detectable effect
              (harness.stats) says how large a difference this seed count would have caught 80 % of the time,
              and how many seeds the measured one would need
  one seed    fewer than two finished seeds on a side: no interval (add seed=0,1,2)

The decisions are harness/sequential.py's, one look of its group-sequential design (a fixed number of seeds).

``headline`` condenses them into the sentence the report opens with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness import sequential
from harness.markdown import table
from harness.stats import minimum_detectable_effect, welch_interval, welch_p_value, what_settles
from results.cells import ALPHA, Cell, Declared, Group, group_cells

BASELINE = "none"
# a rise between the last two validations smaller than this share of min_order_gain is read as flat (noise)
RISING = 0.1


@dataclass(frozen=True)
class Verdict:
    group: Group
    baseline: Group
    verdict: str  # premature | lower | higher | equivalent | inconclusive | one seed ("tested": not yet decided)
    text: str  # the table's cell: numbers and the reason
    p: float | None = None  # Welch's two-sided p, for a comparison in the corrected family
    mde: float | None = None  # an inconclusive one's minimum detectable effect, on the seeds the text reports


def baseline_of(groups: list[Group], declared: Declared | None = None) -> Group | None:
    """The finished group of ``groups`` (one attention and variant) whose pos is the declared baseline, else
    ``pos=none``'s; None when there is none of them (never the best-looking group)."""
    want = declared.pos if declared else BASELINE
    return next((g for g in groups if g.pos == want and g.final.mean is not None), None)


def missing_baseline(groups: list[Group], declared: Declared | None = None) -> str | None:
    """One line when some attention (and variant) has schemes to compare but not its baseline: what to declare."""
    unmatched = [
        key
        for key in dict.fromkeys((g.attn, g.variant) for g in groups)
        if sum(g.final.mean is not None for g in groups if (g.attn, g.variant) == key) >= 2
        and baseline_of([g for g in groups if (g.attn, g.variant) == key], declared) is None
    ]
    if not unmatched:
        return None
    names = sorted({g.pos for g in groups if (g.attn, g.variant) in unmatched and g.final.mean is not None})
    where = ", ".join(f"attn={a}{f' {v}' if v else ''}" for a, v in unmatched)
    if declared:
        return (
            f"No verdict for {where}: report.baseline={declared.pos} is not among its finished schemes "
            f"({', '.join(names)}); declare one of them."
        )
    return (
        f"No verdict for {where}: no baseline was declared and there is no pos={BASELINE} to compare with; "
        f"run the sweep with report.baseline=<pos>, one of {', '.join(names)}, named before the results "
        "(the table shows every scheme; none is picked as the winner)."
    )


def judge(g: Group, base: Group, min_gain: float, c: sequential.Comparison | None = None) -> Verdict:
    """One comparison before the family's correction: premature, one seed, or "tested" with its p-value, on the
    seeds the family decided it with (``c``; a staged comparison's stop) or, outside the family, every finished seed."""
    if g.using_order(min_gain) is False:
        return Verdict(
            g,
            base,
            "premature",
            f"premature — train longer: order gain {g.order_gain.mean:.3f} "
            f"< {min_gain}, not yet using word order; {trend(g, min_gain)}",
        )
    a, b = (c.a, c.b) if c is not None else (g.finals, base.finals)
    ci = welch_interval(a, b)
    if ci is None:
        return Verdict(g, base, "one seed", f"n = {len(a)} vs {len(b)}: no interval; add seeds (seed=0,1,2)")
    diff, low, high = ci
    p = welch_p_value(a, b)
    return Verdict(g, base, "tested", f"Δ = {diff:+.4f} [{low:+.4f}, {high:+.4f}]; p = {p:.2g}", p)


def first_seeds(cells: list[Cell], n: int) -> list[Cell]:
    """The cells a staged sweep's look of ``n`` seeds per arm saw (seeds 0 … n − 1), in seed order."""
    return sorted((c for c in cells if c.seed.isdigit() and int(c.seed) < n), key=lambda c: int(c.seed))


def premature_at(cells: list[Cell], min_gain: float) -> bool:
    """Whether one arm's cells of a look (``first_seeds``) are not yet using word order (``judge``'s premature): a
    staged comparison on that arm ends at that look, since more seeds do not train a model longer."""
    return any(g.using_order(min_gain) is False for g in group_cells(cells, None))


def decided(v: Verdict, c: sequential.Comparison | None, hypotheses: int, design: sequential.Design) -> Verdict:
    """A tested comparison's verdict once the family (``hypotheses`` of them, Holm at the design's level) has decided
    it; a staged design (report.seeds=auto) also says at which look. Any other (``v`` premature or one seed, or not
    in the family: ``c`` None) is ``v``."""
    if v.verdict != "tested" or c is None:
        return v
    a, b, margin = c.a, c.b, design.margin
    said = f"Holm over {hypotheses} hypothes{'es' if hypotheses != 1 else 'is'} at α = {design.alpha:g}"
    if len(design.looks) > 1 and c.decided_at is not None:
        said += f", look {c.decided_at + 1} of {len(design.looks)}, {design.spending} boundary"
    said += f"; n = {len(a)} vs {len(b)}"
    verdict, mde = c.verdict, None
    if verdict in ("lower", "higher"):
        also = f"; and within ±{margin:g}: negligible at the declared margin" if "equivalence" in c.rejected else ""
        text = f"{v.text}: {verdict} loss beyond seed noise ({said}){also}"
    elif verdict == "equivalent":
        text = f"{v.text}: equivalent within ±{margin:g} (report.margin; two one-sided tests, {said})"
    elif len(set(a)) == 1 and len(set(b)) == 1:  # no spread on either side: no power to speak of
        text = f"{v.text}: inconclusive — every seed of both: one loss (no spread: no power figure; {said})"
    else:
        settles = what_settles(a, b, sum(a) / len(a) - sum(b) / len(b), per="scheme")
        untested = "" if margin is not None else "; no margin declared, so equivalence is not tested (report.margin)"
        mde = minimum_detectable_effect(a, b)
        text = f"{v.text}: inconclusive ({said}); the seeds detect |Δ| ≥ {mde:.4f}{settles}{untested}"
    return Verdict(v.group, v.baseline, verdict, text, v.p, mde)


def trend(g: Group, min_gain: float) -> str:
    """How many steps a premature scheme needs, from its own order-gain curve (the seeds' mean at each
    validation): rising, the last two validations' rate carried on to ``min_gain``, a linear estimate (the
    curves seen here rise faster once they start, so it errs long); flat, that no rise has been measured."""
    curve = g.gain_curve()
    if len(curve) < 2:
        return "one validation: no trend measured (log more: trainer.val_check_interval)"
    (s0, g0), (s1, g1) = curve[-2], curve[-1]
    if g1 - g0 <= RISING * min_gain:
        return (
            f"flat ({', '.join(f'{v:.3f}' for _, v in curve[-4:])} at steps {', '.join(str(s) for s, _ in curve[-4:])})"
            f": no rise measured yet, so it needs several times {s1:,} steps"
        )
    rate = (g1 - g0) / (s1 - s0)
    needed = s1 + max(1, math.ceil((min_gain - g1) / rate))  # ≥ 1: seeds without the last step may lift the curve
    return (
        f"rising {100 * rate:.3f} per 100 steps (steps {s0:,}–{s1:,}): at that rate it reaches {min_gain} "
        f"near step {needed:,} (trainer.max_steps)"
    )


def verdicts(
    groups: list[Group],
    min_gain: float,
    declared: Declared | None = None,
    alpha: float = ALPHA,
    margin: float | None = None,
    staged: sequential.Design | None = None,
) -> list[Verdict]:
    """One verdict per group that is not its (attention, variant)'s baseline. Every comparison with two seeds a
    side (a premature one included: its label says premature, its hypotheses still count) is one family
    (harness/sequential.py: Holm at family-wise level ``alpha`` over each one's difference and, with a declared
    ``margin``, its equivalence). ``staged``: the design of a sweep that added seeds in stages
    (report.seeds=auto), replayed look by look from the seeds' losses in seed order, as its sweeper decided: its
    family is every comparison the sweep's cells name, one whose side has no finished seed (a refused pairing)
    included, and one whose arm is not yet using word order at a look's seeds ends at that look."""
    want = declared.pos if declared else BASELINE
    named = [  # each pos with its baseline, either of them finished or not (a staged sweep's family)
        (g, base)
        for key in dict.fromkeys((g.attn, g.variant) for g in groups)
        for base in [g for g in groups if (g.attn, g.variant, g.pos) == (*key, want)]
        for g in groups
        if (g.attn, g.variant) == key and g is not base
    ]
    pairs = [(g, base) for g, base in named if g.final.mean is not None and base.final.mean is not None]
    design = staged or sequential.Design(alpha=alpha, margin=margin)
    if staged is None:  # one look at the seeds there are
        family = [
            design.comparison(_key(g), _key(base), g.finals, base.finals)
            for g, base in pairs
            if min(len(g.finals), len(base.finals)) >= 2  # fewer: one seed, no test
        ]
        sequential.judge(family, design, len(design.looks) - 1)
    else:  # the sweeper's family: each pos with its baseline's cells, a cell with no finished seed included
        keyed = {_key(g): g for pair in named for g in pair}
        family = sequential.settle(
            [(_key(g), _key(base)) for g, base in named],
            design,
            lambda need: {
                k: [c.final_loss for c in first_seeds(keyed[k].cells, n) if c.finished and c.final_loss is not None]
                for k, n in need.items()
            },
            lambda c, n: premature_at(first_seeds(keyed[c.arm].cells, n), min_gain),
        )
    found = {c.arm: c for c in family}
    hypotheses = sum(len(c.kinds) for c in family)
    return [decided(judge(g, base, min_gain, c := found.get(_key(g))), c, hypotheses, design) for g, base in pairs]


def _key(g: Group) -> str:
    return f"{g.label} {g.attn} {g.variant}"


def headline(
    found: list[Verdict], min_gain: float, missing: str | None = None, alpha: float = ALPHA, margin: float | None = None
) -> str:
    """One sentence: how many comparisons separate, how many are premature, what the ties could detect; then
    ``missing`` (``missing_baseline``), where some schemes had no declared baseline to be compared with."""
    if not found:
        return missing or (
            "Verdict: nothing to compare (a comparison needs two finished schemes with the same attention)."
        )
    count = {
        v: sum(f.verdict == v for f in found)
        for v in ("lower", "higher", "equivalent", "inconclusive", "premature", "one seed")
    }
    corrected = f" (Holm-corrected at family-wise α = {alpha:g})" if any(f.p is not None for f in found) else ""
    mdes = [f.mde for f in found if f.mde is not None]  # what the inconclusive ones could have detected
    parts = [
        f"{count['lower']} lower and {count['higher']} higher than their baseline beyond seed noise{corrected}",
        f"{count['equivalent']} equivalent within ±{margin:g} (report.margin)"
        if margin is not None
        else "none can be equivalent (no report.margin declared)",
        f"{count['inconclusive']} inconclusive"
        + (f" (the seeds could detect |Δ| ≥ {min(mdes):.3f} … {max(mdes):.3f} nats/token)" if mdes else ""),
        *(
            [f"{count['premature']} premature (not yet using word order, order gain < {min_gain}: train longer)"]
            if count["premature"]
            else []
        ),
        *([f"{count['one seed']} with one seed (no interval)"] if count["one seed"] else []),
    ]
    return (
        f"Verdict on {len(found)} comparison{'s' * (len(found) != 1)}: "
        + "; ".join(parts)
        + "."
        + (f" {missing}" if missing else "")
    )


def section(
    found: list[Verdict],
    min_gain: float,
    declared: Declared | None = None,
    missing: str | None = None,
    alpha: float = ALPHA,
    margin: float | None = None,
) -> list[str]:
    """The report's Verdicts section (markdown lines) for ``verdicts(...)``."""
    if not found:
        return ["## Verdicts", "", missing, ""] if missing else []
    named = (
        f"`pos={declared.pos}`, {declared.when}" if declared else f"`pos={BASELINE}` (no report.baseline was declared)"
    )
    rows = [[f.group.label, f.group.attn, f.baseline.pos, f.verdict, f.text] for f in found]
    return [
        "## Verdicts",
        "",
        headline(found, min_gain, missing, alpha, margin),
        "",
        "Each scheme's per-seed final val loss against the baseline with the same attention (and the same "
        f"other overrides): {named}. Δ in nats/token with its Welch 95 % interval and Welch's two-sided p; "
        "lower / higher only where Holm's step-down procedure over the family rejects (report.alpha); "
        + (
            f"equivalent only where the two one-sided tests show |Δ| < {margin:g}, the margin declared before the "
            "sweep ran (report.margin), in the same family; "
            if margin is not None
            else "no equivalence margin was declared (report.margin), so no comparison can be shown equivalent; "
        )
        + "inconclusive otherwise: no evidence either way.",
        "",
        *table(["cell", "attn", "baseline", "verdict", "detail"], rows),
        "",
    ]
