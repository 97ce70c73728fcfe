"""Paper-claim reports: ``python -m results paper --preset NAME [--scale toy] [--sweep ID]``.

Reads the preset's claim (conf/experiment/<preset>.yaml ``claim``) and its latest sweep from
MLflow, writes the comparison report (report.md, report.csv, plots) plus README.md with the
claim, the command, the environment, each comparison's difference with a 95 % confidence
interval, and a one-sentence verdict; then refreshes the index results/README.md.

Statistics: arms are compared on the per-seed final value of a metric; Δ = mean(lower) −
mean(than) (or mean(higher) − mean(than)) with Welch's t interval (unequal variances), and the
minimum effect the seed count could have detected (80 % power). A comparison *supports* the claim
when the whole interval lies on the claimed side of 0, *contradicts* it when it lies on the other
side, is *inconclusive* otherwise (always so with fewer than 2 seeds per arm), and is *premature*
when an arm's models are not ready to be compared: they do not yet use word order (order gain below
``report.min_order_gain``; NoPE with bidirectional attention cannot, and is exempt), or, on a
synthetic task, their in-distribution accuracy is below 0.99 (Kazemnejad et al. 2023 and Ruoss et
al. 2023 compare length generalization only between models that solve the training lengths) — exact
match for a claim on exact match (``val/acc…``), per-token accuracy for a claim on it (``val/token_acc…``).

An equivalence claim ("A converges like B") is ``{metric, close: A, to: B, within: m}``, the margin m declared in
the preset before the results: two one-sided Welch tests (TOST) where |Δ| ≤ m, a one-sided test of Δ beyond m
where it is not; it supports the claim when the difference is shown inside ±m, contradicts it when shown outside.

Verdict: *not reproduced* if a comparison between ready arms contradicts the claim; else *premature
— train longer* if any comparison is premature; else *reproduced* if all support it; else
*inconclusive*.

Scale axis: a sweep over scale (``python run.py -m experiment=NAME scale=toy,toy2x,toy4x``, then ``--scale
toy,toy2x,toy4x`` here) gets a verdict per scale, each from that scale's cells alone, and one line on where the
claim starts to hold: "holds from scale X" (reproduced there and at every larger scale), "does not move with
scale here" (one verdict at every scale), or each scale's verdict in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import integrity, sequential
from harness.markdown import table
from harness.stats import (
    holm,
    minimum_detectable_effect,
    paired_detectable_effect,
    paired_interval,
    paired_p_value,
    seeds_needed,
    welch_interval,
    welch_p_value,
    what_settles,
)
from results import store
from results.cells import ALPHA, ALPHA_TAG, GAIN_TAG, GRID_KEYS, MIN_ORDER_GAIN, own_metric
from results.verdicts import first_seeds

PREMATURE = "premature — train longer"
MIN_ID_ACCURACY = 0.99
# a comparison whose arms cannot differ here: every seed of both at the same bound (an accuracy of 0 or 1), or with
# no spread at all. Named, and left out of the claim's verdict: it says nothing either way.
DEGENERATE = ("floor", "ceiling", "no spread", "not measured")  # "not measured": no run of either arm logged it
ARM_KEYS = ("lower", "higher", "than", "cell", "close", "to")  # the comparison keys that name an arm


@dataclass
class Outcome:
    text: str  # one line for the table
    verdict: str  # supports | contradicts | inconclusive | premature | floor | ceiling | no spread
    p: float | None = None  # two-sided p of the comparison's own test (an arm or paired comparison)
    claimed: bool | None = None  # the difference lies in the claimed direction
    hypotheses: int = 1  # in the family's correction: an agreement claim holds two (equivalence and beyond)


def compare(comparison: dict, values: dict[str, list[float]], unready: dict[str, str] | None = None) -> Outcome:
    """One claim comparison: ``{metric, lower, than}``, ``{metric, higher, than}``, ``{metric, below, cell}`` or
    ``{metric, lower_than_metric, cell}`` (two metrics of the same models, e.g. one RoPE model scored under two
    scalings: the paired interval of the per-seed differences; ``values`` then holds each metric's list).
    An arm comparison may add ``than_metric: <metric>``: the reference arm (``than``, ``to``) is read on that metric
    instead (DroPE's model at 4× against the RoPE model under YaRN at 4×, ``val/yarn/loss_at_256``); and
    ``minus: <metric>``: each seed's ``metric − minus`` is compared instead (e.g. how
    much a model's loss grows from its training length to 8×, apart from how well it trained).
    ``unready``: arm -> why its models are not ready to compare (``readiness``); such a comparison is
    premature whatever its numbers say.

    A claim's ``comparisons`` decide its verdict; its optional ``also`` list holds secondary
    comparisons (e.g. a second paper's claim on the same runs) that are reported beside it."""
    outcome = _compare(comparison, values)
    outcome.hypotheses = 2 if "close" in comparison else 1  # claim_family's count, whatever the numbers allow
    why = [f"{arm}: {unready[arm]}" for arm in (comparison.get(k) for k in ARM_KEYS) if unready and arm in unready]
    if why:
        return Outcome(f"{outcome.text} [{'; '.join(why)}]", "premature", hypotheses=outcome.hypotheses)
    return outcome


def _compare(comparison: dict, values: dict[str, list[float]]) -> Outcome:
    """Three forms share the interval and its checks. Two metrics of the same models (``lower_than_metric``): the
    paired interval of the per-seed differences. An agreement claim (``{metric, close: A, to: B, within: m}``, e.g.
    "RoPE on 10 % of the dimensions converges like full RoPE") holds two hypotheses declared with it
    (harness/sequential.py): equivalence (two one-sided tests, Schuirmann 1987; rejected, it supports the claim) and
    beyond (|Δ| ≤ m tested at the margin on both sides; rejected, it contradicts it); its p is the one of the two on
    the measured difference's side, the other's is at least ½ and cannot reject. A direction claim (``lower`` /
    ``higher`` ``than``): Welch's interval. The reference arm (``than``, ``to``) is read on ``than_metric`` where the
    comparison names one: `` (its val/yarn/loss_at_256)`` in the text."""
    metric = comparison["metric"]
    as_read = f" (its {comparison['than_metric']})" if comparison.get("than_metric") else ""
    paired = "lower_than_metric" in comparison
    if paired:
        other = comparison["lower_than_metric"]
        first, than = values[metric], values[other]
        head = f"{metric} − {other} on the same models ({comparison['cell']}, paired by seed)"
    elif "close" in comparison:
        margin = float(comparison["within"])
        first, than = values[comparison["close"]], values[comparison["to"]]
        head = f"{metric}: {comparison['close']} − {comparison['to']}{as_read} within ±{margin:g}"
    elif "below" in comparison:
        xs, limit = values[comparison["cell"]], comparison["below"]
        shown = ", ".join(f"{x:.4g}" for x in xs) or "no finished run"
        verdict = "supports" if xs and max(xs) < limit else "contradicts" if xs and min(xs) >= limit else "inconclusive"
        return Outcome(f"{metric} of {comparison['cell']} < {limit}: per seed {shown}", verdict)
    else:
        side = "lower" if "lower" in comparison else "higher"
        first, than = values[comparison[side]], values[comparison["than"]]
        shown_metric = f"({metric} − {comparison['minus']})" if comparison.get("minus") else metric
        head = f"{shown_metric}: {comparison[side]} − {comparison['than']}{as_read}"
        if not first and not than:  # e.g. a task override that renames the metric: say so, not "too few seeds"
            return Outcome(f"{head}: not measured — no finished run of either arm logged {metric}", "not measured")
    ci = paired_interval(first, than) if paired else welch_interval(first, than)
    n = f"n = {len(first)}" if paired else f"n = {len(first)} vs {len(than)}"
    if ci is None:
        return Outcome(f"{head}: {n}, too few seeds for an interval", "inconclusive")
    degenerate = _degenerate(metric, first, than)
    if degenerate:
        return Outcome(f"{head}: {degenerate[1]} ({n})", degenerate[0])
    diff, low, high = ci
    if "close" in comparison:
        within = abs(diff) <= margin
        tested = sequential.equivalence_p(first, than, margin) if within else sequential.beyond_p(first, than, margin)
        side = "inside the margin (two one-sided tests)" if within else "beyond the margin (tested on both sides of it)"
        # before the family's correction
        verdict = ("supports" if within else "contradicts") if tested <= ALPHA else "inconclusive"
        needed = seeds_needed(first, than, abs(abs(diff) - margin))  # the distance to the margin, as a difference
        settle = f"; n ≥ {needed} per arm would settle it if the difference is as measured" if needed else ""
        return Outcome(
            f"{head} = {diff:+.4f} (95 % CI {low:+.4f} … {high:+.4f}; p = {tested:.2g} {side}; {n}"
            f"{settle if verdict == 'inconclusive' else ''})",
            verdict,
            tested,
            within,
        )
    lower = paired or side == "lower"
    claimed, against = (high < 0, low > 0) if lower else (low > 0, high < 0)
    verdict = "supports" if claimed else "contradicts" if against else "inconclusive"
    mde, p = (
        (paired_detectable_effect(first, than), paired_p_value(first, than))
        if paired
        else (minimum_detectable_effect(first, than), welch_p_value(first, than))
    )
    power = f"; detectable |Δ| ≥ {mde:.4f} at 80 % power" if mde else ""  # no spread: no power figure
    if verdict == "inconclusive" and not paired:  # what would settle it, if the effect is as measured
        power += what_settles(first, than, diff)
    return Outcome(
        f"{head} = {diff:+.4f} (95 % CI {low:+.4f} … {high:+.4f}; p = {p:.2g}; {n}{power})",
        verdict,
        p,
        (diff < 0) == lower and diff != 0,
    )


def _degenerate(metric: str, first: list[float], than: list[float]) -> tuple[str, str] | None:
    """(verdict, why) when both arms hold one value, the same: an accuracy every seed has at 0 (a floor: no arm
    solves this) or 1 (a ceiling: every arm does), or any other metric with no spread at all. The interval is a
    point and the power figure 0, which would read as a precise tie; it is no evidence either way."""
    values = set(first) | set(than)
    if len(values) != 1:
        return None
    value = values.pop()
    if "acc" in metric.rsplit("/", 1)[-1] and value in (0, 1):  # exact match and per-token accuracy lie in [0, 1]
        bound, solved = ("floor", "no arm solves") if value == 0 else ("ceiling", "every arm solves")
        return bound, (
            f"every seed of both arms is {value:g} — a {bound}: {solved} this, so the comparison cannot "
            "discriminate here; left out of the verdict"
        )
    return "no spread", f"every seed of both arms is {value:.6g}: no spread to compare; left out of the verdict"


def _in_family(o: Outcome) -> bool:
    """A comparison the correction counts: one with a p-value that is neither premature nor at a floor/ceiling."""
    return o.p is not None and o.verdict not in ("premature", *DEGENERATE)


def corrected(outcomes: list[Outcome], alpha: float) -> list[Outcome]:
    """The comparisons of one family decided together: a comparison with a p-value supports the claim only when
    Holm's procedure over the family's m p-values (``holm``) rejects it at family-wise level ``alpha`` and its
    difference lies in the claimed direction, contradicts when rejected the other way, else is inconclusive. One
    95 % interval each would let m comparisons reach a verdict by chance m times as often. Premature, floor,
    ceiling and threshold comparisons keep their verdicts and are not in the family."""
    family = [i for i, o in enumerate(outcomes) if _in_family(o)]
    # an agreement claim's second hypothesis (p ≥ ½ on the far side of the margin) counts in m and never rejects
    stand_ins = [1.0] * sum(outcomes[i].hypotheses - 1 for i in family)
    rejected = holm([*(outcomes[i].p or 0.0 for i in family), *stand_ins], alpha)  # p is set for every member
    decided = list(outcomes)
    for i, reject in zip(family, rejected, strict=False):
        o = outcomes[i]
        verdict = ("supports" if o.claimed else "contradicts") if reject else "inconclusive"
        decided[i] = Outcome(o.text, verdict, o.p, o.claimed, o.hypotheses)
    return decided


def family_line(outcomes: list[Outcome], alpha: float) -> str:
    """What the report says of its correction: the family's size and the procedure and level used."""
    m = sum(o.hypotheses for o in outcomes if _in_family(o))
    return (
        f"Corrected for {m} hypothes{'es' if m != 1 else 'is'}: Holm–Bonferroni at family-wise α = {alpha:g} "
        "(report.alpha); p: Welch's two-sided t test (the paired t test for two metrics of the same models). A "
        "comparison supports or contradicts the claim only when its corrected test rejects; premature, floor "
        "and ceiling comparisons are not in the family. Arms that share a seed trained on the same batches in "
        "the same order (an example is a function of the seed and its index: tests/unit/test_token_stream.py)."
    )


def overall(outcomes: list[Outcome]) -> str:
    """The claim's verdict from its comparisons; those at a floor, a ceiling or with no spread say nothing and are
    left out (all of them so: inconclusive)."""
    if not outcomes:
        return "no claim to test"
    if all(o.verdict == "not measured" for o in outcomes):
        return "not measured"
    outcomes = [o for o in outcomes if o.verdict not in DEGENERATE]
    if not outcomes:
        return "inconclusive"
    if any(o.verdict == "contradicts" for o in outcomes):
        return "not reproduced"
    if any(o.verdict == "premature" for o in outcomes):
        return PREMATURE
    return "reproduced" if all(o.verdict == "supports" for o in outcomes) else "inconclusive"


def in_arm(cell, arm: str) -> bool:
    """An arm is one override of the sweep (``pos=rope``) or several (``task=copy pos=rope``): all of them.
    A cell's label names only the swept keys, so pos/attn/seed also match the cell's own tags: a preset that
    fixes ``pos: rope`` and sweeps seeds has cells labelled ``seed=0`` that are still ``pos=rope``."""
    label = set(cell.label.split())
    own = {f"{key}={getattr(cell, key)}" for key in GRID_KEYS if hasattr(cell, key)}
    return all(o in label or o in own for o in arm.split())


def readiness(cells, comparison: dict, min_gain: float) -> dict[str, str]:
    """Arm -> why its finished models are not ready to be compared (absent when they are). A comparison asks
    its arms' in-distribution accuracy in its own terms (``in_distribution_metric``): per token for a comparison
    of per-token accuracies (``val/token_acc…``, Ruoss et al. 2023), a mixture part's own for a part's metric,
    else exact match."""
    metric = in_distribution_metric(str(comparison["metric"]))
    found = {  # the sides this comparison has
        arm: _unready([c for c in cells if c.finished and in_arm(c, arm)], min_gain, metric)
        for arm in (comparison[k] for k in ARM_KEYS if comparison.get(k))
    }
    return {arm: why for arm, why in found.items() if why}


def in_distribution_metric(metric: str) -> str:
    """What a comparison of ``metric`` asks of its arms at the training lengths: the same accuracy without its
    length (``val/token_acc_at_16`` → ``val/token_acc``; a mixture part's ``val/reverse/acc_at_16`` →
    ``val/reverse/acc``, harness/data/tasks/mixture.py), exact match (``val/acc``) for any other metric."""
    found = re.fullmatch(r"(val/(?:[A-Za-z_]\w*/)?(?:token_)?acc)_at_\d+", metric)
    return found.group(1) if found else "val/acc"


def _unready(members, min_gain: float, metric: str = "val/acc") -> str | None:
    gains = [c.order_gain for c in members if c.order_gain is not None and c.order_signal != "none"]
    if gains and sum(gains) / len(gains) < min_gain:
        return f"not yet using word order (order gain {sum(gains) / len(gains):.3f} < {min_gain})"
    accs = [a for a in (c.metrics.get(own_metric(c, metric)) for c in members) if a is not None]
    if accs and sum(accs) / len(accs) < MIN_ID_ACCURACY:
        part = metric.split("/")[1] + " " if metric.count("/") == 2 else ""
        what = "per-token accuracy" if metric.endswith("token_acc") else "accuracy"
        return f"in-distribution {part}{what} {sum(accs) / len(accs):.3f} < {MIN_ID_ACCURACY}"
    return None


def arm_values(client, cells, comparison: dict) -> dict[str, list[float]]:
    """Per arm (an override such as ``pos=rope``) of ``comparison``, the metric's final value of each finished
    seed."""
    values: dict[str, list[float]] = {}
    if "lower_than_metric" in comparison:  # two metrics of the same cells: keyed by metric, pairs kept together
        metrics = (comparison["metric"], comparison["lower_than_metric"])
        pairs = [
            tuple(_final(client, c, m) for m in metrics) for c in cells if c.finished and in_arm(c, comparison["cell"])
        ]
        pairs = [p for p in pairs if None not in p]
        values.update({m: [p[i] for p in pairs] for i, m in enumerate(metrics)})
        return values
    for side in ARM_KEYS:
        arm = comparison.get(side)
        if arm is None or arm in values:
            continue
        metric = comparison.get("than_metric", comparison["metric"]) if side in ("than", "to") else comparison["metric"]
        finals = (_final(client, c, metric, comparison.get("minus")) for c in cells if c.finished and in_arm(c, arm))
        values[arm] = [v for v in finals if v is not None]
    return values


def _final(client, cell, metric: str, minus: str | None = None) -> float | None:
    if minus is not None:
        value, base = _final(client, cell, metric), _final(client, cell, minus)
        return None if value is None or base is None else value - base
    if metric == "val/loss":  # the cell holds it: no store read
        return cell.final_loss
    return client.get_run(cell.run_id).data.metrics.get(own_metric(cell, metric))


def claim_family(comparisons: list[dict]) -> list[sequential.Comparison]:
    """A claim's comparisons as the family a sweep with ``report.seeds=auto`` decides look by look, each side keyed
    ``<index>:<arm>``: a direction claim (lower/higher) holds the difference hypothesis, an agreement claim (close)
    equivalence and beyond at its margin (harness/sequential.py)."""
    return [
        sequential.Comparison(
            f"{i}:{c['close']}", f"{i}:{c['to']}", kinds=("equivalence", "beyond"), margin=float(c["within"])
        )
        if "close" in c
        else sequential.Comparison(f"{i}:{c['lower' if 'lower' in c else 'higher']}", f"{i}:{c['than']}")
        for i, c in enumerate(comparisons)
    ]


def claim_values(client, cells, comparisons: list[dict], need: dict[str, int]) -> dict[str, list[float]]:
    """Per ``<index>:<arm>`` key of ``claim_family``, the arm's values on its comparison's metric among its first n
    seeds, in seed order (what a look of the sweep saw)."""
    values = {}
    for key, n in need.items():
        i, arm = key.split(":", 1)
        values[key] = arm_values(client, first_seeds(cells, n), comparisons[int(i)])[arm]
    return values


def not_ready(cells: Callable[[int], list], comparisons: list[dict], gain: float) -> Callable:
    """``settle``'s stop for a claim: a comparison (``<index>:<arm>`` keys of ``claim_family``) whose arms, at the
    first n seeds a look trained, are not ready (``readiness``: not yet using word order) ends at that look; more
    seeds would not train a model longer. ``cells(n)``: the sweep's cells as the look of n seeds saw them."""

    def stop(c: sequential.Comparison, n: int) -> bool:
        return bool(readiness(cells(n), comparisons[int(c.arm.split(":", 1)[0])], gain))

    return stop


def staged_outcomes(client, cells, comparisons: list[dict], design: sequential.Design, gain: float) -> list[Outcome]:
    """The claim's comparisons as its sweep decided them look by look (``claim_family``, replayed from the runs):
    each one's numbers at the seeds it stopped with, its verdict from the family's group-sequential Holm procedure
    (a premature arm, a floor or a ceiling still said as such)."""
    family = sequential.settle(
        claim_family(comparisons),
        design,
        lambda need: claim_values(client, cells, comparisons, need),
        not_ready(lambda n: first_seeds(cells, n), comparisons, gain),
    )
    outcomes = []
    for comparison, c in zip(comparisons, family, strict=True):
        arms = {key.split(":", 1)[1]: v for key, v in ((c.arm, c.a), (c.baseline, c.b))}
        o = compare(comparison, arms, readiness(cells, comparison, gain))
        if o.verdict in ("premature", *DEGENERATE):  # said as such, whatever the looks decided
            outcomes.append(o)
        else:
            claimed = {"lower": "lower", "higher": "higher", "close": "equivalent"}[
                next(k for k in ARM_KEYS if k in comparison)
            ]
            verdict = (
                "supports" if c.verdict == claimed else "inconclusive" if c.verdict == "inconclusive" else "contradicts"
            )
            look = f"look {(c.decided_at or 0) + 1} of {len(design.looks)}"
            when = f"; decided at {look}" if c.verdict != "inconclusive" else f"; undecided after {look}"
            outcomes.append(Outcome(o.text + when, verdict, o.p, o.claimed, o.hypotheses))
    return outcomes


SPENDING_NAMES = {"obrien-fleming": "an O'Brien–Fleming-type", "pocock": "a Pocock-type"}  # Lan–DeMets'


def staged_line(outcomes: list[Outcome], design: sequential.Design) -> str:
    """What the report says of a staged claim's family: its design and its size."""
    m = sum(o.hypotheses for o in outcomes)  # a premature one too: it ended at its first look, still counted
    return (
        f"Seeds in stages (report.seeds=auto): {design.stage} per arm, then {design.stage} more at each look to the "
        f"comparisons still undecided, up to {design.most}; "
        f"{m} hypothes{'es' if m != 1 else 'is'} decided as one family by Holm's procedure, each test against "
        f"{SPENDING_NAMES[design.spending]} α-spending boundary (harness/sequential.py) at family-wise α = "
        f"{design.alpha:g}. A "
        "comparison supports or contradicts the claim only when one of its hypotheses is rejected; futility stops "
        "one that more seeds could not decide. Arms that share a seed trained on the same batches in the same order."
    )


def _wall_time(sweep) -> str:
    """The sweep's wall time: its parent run's start to end (the whole `run.py -m`, cells and report)."""
    parent = getattr(sweep, "parent", None)
    if parent is None or not parent.info.end_time:
        return "Wall time: not recorded (no finished parent run)."
    minutes = (parent.info.end_time - parent.info.start_time) / 60000
    tags = parent.data.tags
    launcher = f" with `{tags['hydra_overrides']}`" if tags.get("hydra_overrides") else ""
    return (
        f"Wall time: {minutes:.1f} min for {len(sweep.runs)} runs{launcher} on host "
        f"{tags.get('host', '(not recorded)')}."
    )


def write_paper_report(
    client, sweep, preset: str, scale: str, claim: dict, out: Path, shown: Path | None = None
) -> str:
    """README.md and the sweep's report into ``out`` (``integrity.report_folder``'s staging folder, to be ``shown``)."""
    from results.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    write_report(store.sweep_report(client, sweep, shown_out=shown or out), out)
    cells = store.cells_of(client, sweep)
    gain = claim.get("min_order_gain", MIN_ORDER_GAIN)

    def judged(c: dict, among=cells) -> Outcome:
        return compare(c, arm_values(client, among, c), readiness(among, c, gain))

    _pin_overrides(cells, sweep)
    scales = scale.split(",")
    if len(scales) > 1:  # a sweep over scale: each scale's cells judged alone, then where the claim holds
        # a scale sweep may narrow the preset (task=reverse pos=rope): comparisons whose arms it did not train drop out
        swept = [
            c
            for c in claim["comparisons"]
            if all(any(in_arm(cell, c[k]) for cell in cells) for k in ARM_KEYS if k in c)
        ]
        per_scale = {
            s: corrected([judged(c, at) for c in swept], claim.get("alpha", ALPHA))
            for s in scales
            if (at := [c for c in cells if f"scale={s}" in c.label.split()])
        }
        return _write_scales_report(sweep, preset, scale, claim, per_scale, out)
    alpha = claim.get("alpha", ALPHA)
    design = store.staged_design(sweep, claim=True)
    outcomes = (  # a sweep that added seeds by the claim's comparisons: their decisions, replayed
        staged_outcomes(client, cells, claim["comparisons"], design, gain)
        if design is not None
        else corrected([judged(c) for c in claim["comparisons"]], alpha)
    )
    verdict = overall(outcomes)
    secondary = corrected([judged(c) for c in claim.get("also", [])], alpha)  # a family of its own, not the verdict
    lines = [
        f"# {preset} ({scale} scale)",
        "",
        f"**Claim** ({claim['source']}): {claim['statement']}",
        "",
        f"**Verdict: {verdict} at {scale} scale.** " + " ".join(f"{o.text} → {o.verdict}." for o in outcomes),
        "",
        *([f"**At {scale} scale:** {claim['scale_note']}", ""] if claim.get("scale_note") else []),
        *([family_line(outcomes, alpha) if design is None else staged_line(outcomes, design), ""] if outcomes else []),
        *_provenance(sweep, preset, scale),
        *evaluation_positions(cells),
        *_comparisons_table(outcomes, secondary),
        *_sections(client, cells, claim, out),
        *_sweep_report(out, claim),
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return verdict


def along_scale(verdicts: dict[str, str]) -> str:
    """Where a claim starts to hold, from each scale's verdict (scales in increasing order)."""
    names, said = list(verdicts), list(verdicts.values())
    if len(set(said)) == 1:
        return f"{said[0]} at every scale ({', '.join(names)}): does not move with scale here"
    if said[-1] == "reproduced":
        first = next(i for i in range(len(said)) if all(v == "reproduced" for v in said[i:]))
        return f"holds from scale {names[first]} (" + "; ".join(f"{n}: {v}" for n, v in verdicts.items()) + ")"
    return "changes with scale without holding: " + "; ".join(f"{n}: {v}" for n, v in verdicts.items())


def _write_scales_report(
    sweep, preset: str, scale: str, claim: dict, per_scale: dict[str, list[Outcome]], out: Path
) -> str:
    """README.md of a sweep over scale (``scale``: its scales comma-separated): the line on where the claim holds,
    then each scale's comparisons."""
    verdicts = {s: overall(outcomes) for s, outcomes in per_scale.items()}
    summary = (
        along_scale(verdicts) if verdicts else "nothing to compare (no finished cell names a scale)"
    ) + _coverage(per_scale, len(claim["comparisons"]))
    lines = [
        f"# {preset} (scales {scale.replace(',', ', ')})",
        "",
        f"**Claim** ({claim['source']}): {claim['statement']}",
        "",
        f"**Verdict: {summary}.**",
        "",
        "Per scale, c" + family_line(next(iter(per_scale.values()), []), claim.get("alpha", ALPHA)).removeprefix("C"),
        "",
        *_provenance(sweep, preset, scale),
        "## Verdict per scale",
        "",
        *table(
            ["scale", "verdict", "comparisons"],
            [
                [s, verdicts[s], "<br>".join(f"{o.text} → {o.verdict}" for o in outcomes)]
                for s, outcomes in per_scale.items()
            ],
        ),
        "",
        *_sweep_report(out, claim),
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return summary


def _coverage(per_scale: dict[str, list[Outcome]], declared: int) -> str:
    """What part of the claim a scale sweep tested: a sweep that narrows the preset (``task=reverse pos=rope``)
    measures some of its primary comparisons (each scale lists the same ones, in order); its verdict is about
    those, and says so."""
    # a row per comparison, across the scales
    measured = sum(any(o.verdict != "not measured" for o in row) for row in zip(*per_scale.values(), strict=True))
    if not per_scale or measured == declared:
        return ""
    return (
        f", on {measured} of the claim's {declared} primary comparisons (the others' arms or metrics were not "
        "trained in this sweep)"
    )


def _provenance(sweep, preset: str, scale: str) -> list[str]:
    """The commands that regenerate a report (the sweep's own command line, else the preset's at ``scale``), the
    sweep's wall time and its environment."""
    tags = sweep.runs[0].data.tags if sweep.runs else {}
    return [
        f"Command: `python run.py -m {_overrides(sweep) or f'experiment={preset} scale={scale}'}`, then "
        f"`python -m results paper --preset {preset} --scale {scale}"
        + (f" --sweep {sweep.sweep_id}" if sweep.sweep_id else "")
        + "`.",
        "",
        _wall_time(sweep),
        "",
        f"Environment: Python {tags.get('python', '?')}, torch {tags.get('torch', '?')}, commit "
        f"{tags.get('git_sha', '?')}, corpus sha256 {tags.get('corpus_sha256', '?')} "
        f"(data={tags.get('data', '?')}).",
        "",
    ]


def _sweep_report(out: Path, claim: dict) -> list[str]:
    """The sweep's own report.md, below its title, with one verdict per report: the claim's. The sweep's headline
    (its loss-vs-baseline count) is dropped, and its Verdicts section kept only where a comparison of the claim
    (or of its ``also``) is judged on val/loss, retitled as what it is."""
    body = (out / "report.md").read_text().split("\n", 1)[1].strip()
    body = re.sub(r"^\*\*(Verdict on |No verdict |Verdict: )[^\n]*\*\*\n\n", "", body, count=1, flags=re.M)
    verdicts = re.search(r"^## Verdicts\n.*?(?=^## |\Z)", body, flags=re.S | re.M)
    if verdicts:
        body = body.replace(
            verdicts.group(0),
            "### Final val loss against the sweep's baseline (not the claim's verdict)\n"
            + verdicts.group(0).split("\n", 1)[1]
            if any(c.get("metric", "val/loss") == "val/loss" for c in [*claim["comparisons"], *claim.get("also", [])])
            else "",
        )
    return ["## Sweep report", "", body]


def _pin_overrides(cells, sweep) -> None:
    """A cell's label names only the overrides that vary across the sweep; those the command line pinned for every
    cell (``python run.py -m experiment=X task=reverse …``: its parent's ``sweep_overrides``) are part of every
    cell too, so an arm that names them (``task=reverse pos=rope``) matches."""
    pinned = [o for o in _overrides(sweep).split() if "," not in o and not o.startswith(("experiment=", "scale="))]
    for cell in cells:
        cell.label = " ".join([*pinned, *(o for o in cell.label.split() if o not in pinned)])


def _overrides(sweep) -> str:
    """The sweep's own command line (its parent run's ``sweep_overrides`` tag), empty when not recorded."""
    parent = getattr(sweep, "parent", None)
    return parent.data.tags.get("sweep_overrides", "") if parent else ""


def evaluation_positions(cells) -> list[str]:
    """Where the cells with randomized positions (pos.randomize) were evaluated: at a fresh sample from
    [0, max_position) per forward (the default, as Ruoss et al.'s reference code) or at 0 … T−1."""
    ranges: dict[str, set[str]] = {}
    for cell in cells:
        if getattr(cell, "eval_positions", None):
            ranges.setdefault(cell.eval_positions, set()).add(str(cell.max_position))
    if not ranges:
        return []
    words = {
        "sampled": "at a fresh sorted sample of positions per forward (`pos.eval_positions=sampled`, as Ruoss "
        "et al.'s reference code)",
        "ordered": "at positions 0 … T−1 (`pos.eval_positions=ordered`)",
    }
    said = "; ".join(f"{words[m]}, max_position {', '.join(sorted(r))}" for m, r in sorted(ranges.items()))
    return [
        f"Positions at evaluation: the cells with randomized positions (`pos.randomize=true`) are evaluated "
        f"{said}; the others at 0 … T−1.",
        "",
    ]


def _comparisons_table(outcomes: list[Outcome], secondary: list[Outcome]) -> list[str]:
    if not outcomes and not secondary:
        return []
    return [
        "## Comparisons",
        "",
        *table(
            ["comparison", "outcome"],
            [
                *([o.text, o.verdict] for o in outcomes),
                *([f"{o.text} (secondary: not part of the verdict)", o.verdict] for o in secondary),
            ],
        ),
        "",
    ]


def _sections(client, cells, claim: dict, out: Path) -> list[str]:
    """Preset-specific sections named by the claim's ``sections`` list (e.g. ``[theta]``)."""
    from results.grid import grid_section
    from results.theta import theta_section

    SECTIONS = {"theta": theta_section, "grid": grid_section}
    return [line for name in claim.get("sections", []) for line in (*SECTIONS[name](client, cells, out), "")]


def write_index(results_dir: Path) -> None:
    """results/README.md (``render_index``), rewritten whenever a committed report is."""
    (results_dir / "README.md").write_text(render_index(results_dir))


def render_index(results_dir: Path) -> str:
    """The index of ``results_dir``: one line per report folder, with the verdict line its README opens with; a
    sealed folder is checked against its SHA256SUMS first (one from before seals is read as it is)."""
    rows = []
    for readme in sorted(results_dir.glob("*/README.md")):
        integrity.check_report(
            readme.parent,
            "run the command its README names again, or restore the folder (git checkout)",
            needs=["README.md"],
        )
        text = readme.read_text().splitlines()
        verdict = next((line for line in text if line.startswith("**Verdict")), "")
        rows.append(
            [
                f"[{readme.parent.name}]({readme.parent.name}/README.md)",
                text[0].lstrip("# "),
                verdict.split("**")[1] if verdict else "—",
                _cost(text),
            ]
        )
    return (
        "\n".join(
            [
                "# results/",
                "",
                "Reports produced by posbench's own commands, each with the command that regenerates it; nothing here",
                "is hand-edited. Paper presets: `python run.py -m experiment=<preset>` then",
                "`python -m results paper --preset <preset>`; benchmarks: "
                "`python -m harness.bench --out results/bench`;",
                "a pretrained model under each RoPE scaling: `posbench hf-eval MODEL_DIR … --out results/<name>`.",
                "This index: `python -m results index` "
                "(tests/unit/test_paper.py fails when it disagrees with the reports).",
                "",
                *table(["report", "what", "verdict / summary", "runs, wall time"], rows),
            ]
        )
        + "\n"
    )


def _cost(text: list[str]) -> str:
    """A report's runs and wall time from its ``Wall time:`` line (``_wall_time``), and whether its seeds came in
    stages (report.seeds=auto); — where it has none."""
    found = next((m for line in text if (m := re.match(r"Wall time: ([\d.]+) min for (\d+) runs", line))), None)
    if found is None:
        return "—"
    staged = any(line.startswith("Seeds in stages") for line in text)
    return f"{found[2]} runs, {found[1]} min{', seeds in stages' if staged else ''}"


def main(args) -> int:
    """Called by ``python -m results paper``."""
    from harness.config.load import load

    spec = load([f"experiment={args.preset}", f"scale={args.scale.split(',')[0]}"], multirun=True)
    uri, client = store.open_store(args.tracking_uri)
    try:
        sweep = store.find_sweep(client, spec.logger.experiment, args.sweep)
    except LookupError as e:
        raise LookupError(f"{e} (store: {uri}); run `python run.py -m experiment={args.preset}` first") from None
    # a scale axis: its first scale's claim, judged at the order-gain threshold and level the sweep ran with
    # (report.min_order_gain=…, report.alpha=… on its command line, recorded on its parent run; else the preset's)
    # unless the claim sets its own
    tags = sweep.parent.data.tags if sweep.parent else {}
    claim = {
        "min_order_gain": float(tags.get(GAIN_TAG) or spec.report.min_order_gain),
        "alpha": float(tags.get(ALPHA_TAG) or spec.report.alpha),
        **(spec.run.claim or {}),
    }
    out = Path(args.out)
    with integrity.report_folder(out) as staging:  # written whole or not at all, then sealed (harness/integrity.py)
        verdict = write_paper_report(client, sweep, args.preset, args.scale, claim, staging, shown=out)
    write_index(out.parent)
    print(f"{args.preset}: {verdict} ({out / 'README.md'})")
    return 0
