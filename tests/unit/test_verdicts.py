"""Every sweep report opens with a verdict: beyond seed noise, equivalent within a declared margin, inconclusive with
its detectable effect (never a "tie" by non-rejection), or premature."""

import pytest

from harness.stats import minimum_detectable_effect, seeds_needed, welch_interval, welch_p_value
from results.cells import Cell, Declared, build_report
from results.verdicts import headline, missing_baseline, verdicts


def cell(pos, seed, loss, gain=1.0, attn="softmax", variant="", signal="scheme", status="finished", gains=()):
    """``gains``: the order gain's history as (step, value); its last value is ``gain``'s default."""
    gains = list(gains) or ([] if gain is None else [(100, gain)])
    metrics = {} if gain is None else {"val/order_gain": gains[-1][1]}
    return Cell(
        f"{pos}{attn}{variant}{seed}",
        "n",
        f"pos={pos} {variant}".strip(),
        pos,
        attn,
        str(seed),
        status,
        variant=variant,
        val=[(100, loss)],
        metrics=metrics,
        order_signal=signal,
        gains=gains,
    )


def report(cells):
    return build_report(cells, "t", [])


def test_a_scheme_beyond_seed_noise_is_lower_and_an_undecided_one_says_what_it_could_detect():
    none = [cell("none", s, x, gain=0.0, signal="none") for s, x in enumerate([3.0, 3.1, 3.05])]
    rope = [cell("rope", s, x) for s, x in enumerate([2.0, 2.1, 2.05])]  # far below none
    learned = [cell("learned", s, x) for s, x in enumerate([3.0, 3.2, 2.9])]  # overlaps none
    found = {v.group.pos: v for v in verdicts(report(none + rope + learned).groups, 0.05)}
    assert set(found) == {"rope", "learned"} and {v.baseline.pos for v in found.values()} == {"none"}
    assert found["rope"].verdict == "lower"
    diff, low, high = welch_interval([3.0, 3.2, 2.9], [3.0, 3.1, 3.05])
    assert found["learned"].verdict == "inconclusive" and low < 0 < high
    mde = minimum_detectable_effect([3.0, 3.2, 2.9], [3.0, 3.1, 3.05])
    assert f"the seeds detect |Δ| ≥ {mde:.4f}" in found["learned"].text and f"{diff:+.4f}" in found["learned"].text
    n = seeds_needed([3.0, 3.2, 2.9], [3.0, 3.1, 3.05], diff)  # what would settle it, were Δ as measured
    assert (f"n ≥ {n} per scheme would detect" if n else "more than 1000 seeds per scheme") in found["learned"].text
    assert "no margin declared, so equivalence is not tested (report.margin)" in found["learned"].text
    line = headline(list(found.values()), 0.05)
    assert line.startswith(
        "Verdict on 2 comparisons: 1 lower and 0 higher than their baseline beyond seed noise "
        "(Holm-corrected at family-wise α = 0.05); none can be equivalent (no report.margin "
        "declared); 1 inconclusive (the seeds could detect"
    )
    p = welch_p_value([2.0, 2.1, 2.05], [3.0, 3.1, 3.05])
    assert found["rope"].p == pytest.approx(p) and f"p = {p:.2g}" in found["rope"].text


def test_the_sweeps_comparisons_are_one_family_corrected_by_holm():
    """One scheme 0.1 nats below none with p ≈ 0.02 is "lower" alone; five such schemes in one sweep are five tests,
    and at family-wise 0.05 Holm asks the smallest p to clear 0.01: each is then inconclusive. A stricter
    report.alpha leaves a lone one inconclusive too."""
    none = [cell("none", s, x, gain=0.0, signal="none") for s, x in enumerate([3.0, 3.06, 3.03])]
    schemes = [[cell(f"s{k}", s, x) for s, x in enumerate([2.92, 2.98, 2.95])] for k in range(5)]
    p = welch_p_value([2.92, 2.98, 2.95], [3.0, 3.06, 3.03])
    assert 0.01 < p < 0.05
    [alone] = verdicts(report(none + schemes[0]).groups, 0.05)
    assert alone.verdict == "lower" and "Holm over 1 hypothesis at α = 0.05" in alone.text
    five = verdicts(report(none + [c for s in schemes for c in s]).groups, 0.05)
    assert [v.verdict for v in five] == ["inconclusive"] * 5
    assert all("Holm over 5 hypotheses at α = 0.05" in v.text for v in five)
    [strict] = verdicts(report(none + schemes[0]).groups, 0.05, alpha=0.01)
    assert strict.verdict == "inconclusive" and "Holm over 1 hypothesis at α = 0.01" in strict.text


def test_identical_seeds_are_inconclusive_without_a_power_figure_unless_a_margin_was_declared():
    """A scheme that changes nothing (every seed's loss equal to none's): p = 1, and no spread to measure power by,
    so no "detects |Δ| ≥ 0.0000" line; with a margin declared, the difference is known to be 0: equivalent."""
    none = [cell("none", s, 2.5, gain=0.0, signal="none") for s in range(3)]
    same = [cell("same", s, 2.5) for s in range(3)]
    [v] = verdicts(report(none + same).groups, 0.05)
    assert v.verdict == "inconclusive" and "no spread: no power figure" in v.text and "detects" not in v.text
    assert "could detect" not in headline([v], 0.05)
    [v] = verdicts(report(none + same).groups, 0.05, margin=0.01)
    assert v.verdict == "equivalent" and "within ±0.01" in v.text


def test_equivalence_needs_a_declared_margin_and_two_one_sided_tests_that_reject():
    """Two schemes 0.002 nats apart with seeds spread by ~0.01: not different, and within ±0.05 by TOST (each
    one-sided test's p well below α / 2, the Holm level of two hypotheses); within ±0.005 it cannot be shown, so
    it stays inconclusive; with no margin it is never called equivalent."""
    from harness.sequential import equivalence_p

    base = [3.000, 3.010, 2.990, 3.005, 2.995]
    other = [3.002, 3.012, 2.992, 3.007, 2.997, 3.001]
    none = [cell("none", s, x, gain=0.0, signal="none") for s, x in enumerate(base)]
    close = [cell("close", s, x) for s, x in enumerate(other)]
    assert equivalence_p(other, base, 0.05) < 0.025 < equivalence_p(other, base, 0.005)
    [wide] = verdicts(report(none + close).groups, 0.05, margin=0.05)
    assert wide.verdict == "equivalent" and "Holm over 2 hypotheses" in wide.text
    [narrow] = verdicts(report(none + close).groups, 0.05, margin=0.005)
    assert narrow.verdict == "inconclusive" and "no margin declared" not in narrow.text
    [undeclared] = verdicts(report(none + close).groups, 0.05)
    assert undeclared.verdict == "inconclusive" and "no margin declared" in undeclared.text
    assert "1 equivalent within ±0.05 (report.margin)" in headline([wide], 0.05, margin=0.05)


def test_a_staged_comparison_shows_the_numbers_of_the_seeds_it_was_decided_on():
    """report.seeds=auto: rope is decided at the first look on 3 seeds a side; none trained 6 for another
    comparison. Its Δ, interval and p are those of the 3 vs 3 the family decided on, as its "n = 3 vs 3" says."""
    from harness.sequential import Design

    base = [3.0, 3.1, 3.05, 2.95, 3.02, 3.08]
    none = [cell("none", s, x, gain=0.0, signal="none") for s, x in enumerate(base)]
    rope = [cell("rope", s, x) for s, x in enumerate([2.0, 2.1, 2.05])]
    [v] = verdicts(report(none + rope).groups, 0.05, staged=Design(0.05, 3, 9, "pocock"))
    diff, low, high = welch_interval([2.0, 2.1, 2.05], base[:3])
    p = welch_p_value([2.0, 2.1, 2.05], base[:3])
    assert v.verdict == "lower" and "look 1 of 3" in v.text and "n = 3 vs 3" in v.text
    assert v.text.startswith(f"Δ = {diff:+.4f} [{low:+.4f}, {high:+.4f}]; p = {p:.2g}:") and v.p == pytest.approx(p)


def test_the_headlines_detectable_effects_are_the_rows():
    """report.seeds=auto: "same" (no difference) stops for futility at the first look on 3 seeds, while none trains
    on to 9 for "slow". The headline's range of detectable effects is the rows' own (3 vs 3 and 9 vs 9)."""
    from harness.sequential import Design

    base = [3.00, 3.06, 2.97, 3.03, 2.99, 3.05, 3.01, 2.96, 3.04]
    same, slow = [3.01, 2.98, 3.04], [2.98, 3.02, 2.95, 3.00, 2.96, 3.03, 2.97, 2.99, 3.01]
    cells = [cell("none", s, x, gain=0.0, signal="none") for s, x in enumerate(base)]
    cells += [cell("same", s, x) for s, x in enumerate(same)] + [cell("slow", s, x) for s, x in enumerate(slow)]
    found = verdicts(report(cells).groups, 0.05, staged=Design(0.05, 3, 9, "pocock"))
    assert [v.verdict for v in found] == ["inconclusive", "inconclusive"] and "n = 3 vs 3" in found[0].text
    low, high = minimum_detectable_effect(slow, base), minimum_detectable_effect(same, base[:3])
    assert f"the seeds detect |Δ| ≥ {high:.4f}" in found[0].text and f"|Δ| ≥ {low:.4f}" in found[1].text
    assert f"(the seeds could detect |Δ| ≥ {low:.3f} … {high:.3f} nats/token)" in headline(found, 0.05)


def test_a_scheme_whose_models_ignore_order_is_premature_whatever_its_loss():
    none = [cell("none", s, 3.0 + s / 10, gain=0.0, signal="none") for s in range(3)]
    learned = [cell("learned", s, 2.0 + s / 10, gain=0.01) for s in range(3)]  # lower, but order gain 0.01
    [v] = verdicts(report(none + learned).groups, 0.05)
    assert v.verdict == "premature" and "train longer" in v.text and "0.010 < 0.05" in v.text
    assert "1 premature" in headline([v], 0.05)
    [v] = verdicts(report(none + learned).groups, 0.005)  # the threshold is the user's (report.min_order_gain)
    assert v.verdict == "lower"


def test_without_pos_none_or_a_declared_baseline_no_winner_is_picked_after_the_results():
    """The old rule (the lowest-loss scheme as baseline) compared every scheme with the winner, and its direction
    flipped with the outcome: rope vs t5 here, t5 vs rope had the losses been the other way round."""
    cells = [cell("rope", s, 2.0 + s / 100) for s in range(2)] + [cell("t5", s, 2.5 + s / 100) for s in range(2)]
    cells += [cell("rope", s, 1.0, attn="local") for s in range(2)]  # alone in its attention: nothing to compare
    groups = report(cells).groups
    assert verdicts(groups, 0.05) == []
    missing = missing_baseline(groups)
    assert missing.startswith("No verdict for attn=softmax: no baseline was declared and there is no pos=none")
    assert "report.baseline=<pos>, one of rope, t5" in missing and "local" not in missing
    assert headline([], 0.05, missing) == missing


@pytest.mark.parametrize("declared, losses", [("rope", (2.0, 2.5)), ("rope", (2.5, 2.0)), ("t5", (2.0, 2.5))])
def test_a_declared_baseline_is_the_baseline_whatever_the_results(declared, losses):
    rope, t5 = losses
    cells = [cell("rope", s, rope + s / 100) for s in range(2)] + [cell("t5", s, t5 + s / 100) for s in range(2)]
    cells += [cell("none", s, 3.0 + s / 100, gain=0.0, signal="none") for s in range(2)]  # declared beats none
    named = Declared(declared, "declared before the sweep ran (report.baseline)")
    found = verdicts(report(cells).groups, 0.05, named)
    assert {v.baseline.pos for v in found} == {declared} and {v.group.pos for v in found} == {"rope", "t5", "none"} - {
        declared
    }
    other = next(v for v in found if v.group.pos != "none")
    assert other.verdict == ("lower" if (t5 < rope) == (declared == "rope") else "higher")
    assert missing_baseline(report(cells).groups, named) is None


def test_a_declared_baseline_absent_from_the_sweep_is_said_not_replaced():
    cells = [cell("rope", s, 2.0 + s / 100) for s in range(2)] + [cell("t5", s, 2.5 + s / 100) for s in range(2)]
    named = Declared("alibi", "declared before the sweep ran (report.baseline)")
    assert verdicts(report(cells).groups, 0.05, named) == []
    assert missing_baseline(report(cells).groups, named) == (
        "No verdict for attn=softmax: report.baseline=alibi is not among its finished schemes (rope, t5); "
        "declare one of them."
    )


def test_variants_compare_within_themselves_and_one_seed_has_no_interval():
    cells = [
        cell("none", 0, 3.0, gain=0.0, signal="none", variant="task=copy"),
        cell("rope", 0, 2.0, variant="task=copy"),
        cell("none", 0, 1.0, gain=0.0, signal="none", variant="task=reverse"),
        cell("rope", 0, 1.5, variant="task=reverse"),
    ]
    found = verdicts(report(cells).groups, 0.05)
    assert [(v.group.variant, v.baseline.variant, v.verdict) for v in found] == [
        ("task=copy", "task=copy", "one seed"),
        ("task=reverse", "task=reverse", "one seed"),
    ]
    assert "add seeds" in found[0].text


def test_failed_cells_are_left_out_and_nothing_to_compare_says_so():
    cells = [cell("rope", 0, 2.0), cell("t5", 0, 0.0, status="error")]
    assert verdicts(report(cells).groups, 0.05) == []
    assert headline([], 0.05).startswith("Verdict: nothing to compare")


def test_a_premature_scheme_says_how_many_steps_it_needs_from_its_own_curve():
    """Rising: the last two validations' rate (seeds' mean) carried on to min_order_gain; flat: no estimate."""
    none = [cell("none", s, 3.0, gain=0.0, signal="none") for s in range(3)]
    rising = [
        cell("rope", s, 2.9, gains=[(50, 0.0), (100, 0.01 + s / 1000), (150, 0.03 + s / 1000)]) for s in range(3)
    ]  # mean 0.011 → 0.031 over 50 steps: 0.04 per 100; 0.05 is 0.019 away: 48 steps
    [v] = verdicts(report(none + rising).groups, 0.05)
    assert v.verdict == "premature"
    assert v.text.endswith(
        "rising 0.040 per 100 steps (steps 100–150): at that rate it reaches 0.05 near step 198 (trainer.max_steps)"
    )
    flat = [cell("learned", s, 3.0, gains=[(50, 0.0), (100, 0.001), (150, 0.004)]) for s in range(3)]  # +0.003
    [v] = verdicts(report(none + flat).groups, 0.05)  # below a tenth of min_order_gain: noise, not a rise
    assert v.text.endswith(
        "flat (0.000, 0.001, 0.004 at steps 50, 100, 150): no rise measured yet, so it needs several times 150 steps"
    )
    ragged = [
        cell("learned", 0, 3.0, gains=[(50, 0.0), (100, 0.02)]),  # a seed without step 150: the steps all
        cell("learned", 1, 3.0, gains=[(50, 0.0), (100, 0.03), (150, 0.04)]),
    ]  # seeds logged count
    [v] = verdicts(report(none + ragged).groups, 0.05)
    assert "rising 0.050 per 100 steps (steps 50–100)" in v.text
    past = [
        cell("learned", 0, 3.0, gains=[(50, 0.0), (100, 0.06)]),  # the shared steps' mean is past 0.05 while
        cell("learned", 1, 3.0, gains=[(50, 0.0), (100, 0.08), (150, 0.01)]),
    ]  # the finals' mean is not
    [v] = verdicts(report(none + past).groups, 0.05)
    assert v.verdict == "premature" and v.text.endswith("near step 101 (trainer.max_steps)")  # never at or before


@pytest.mark.parametrize("gain, expected", [(None, "lower"), (0.2, "lower")])
def test_unmeasured_order_gain_is_not_premature(gain, expected):
    """Runs logged before the order check existed (no val/order_gain) are judged on their losses."""
    cells = [cell("none", s, 3.0 + s / 10, gain=0.0, signal="none") for s in range(3)]
    cells += [cell("rope", s, 2.0 + s / 10, gain=gain) for s in range(3)]
    [v] = verdicts(report(cells).groups, 0.05)
    assert v.verdict == expected


def test_the_console_summary_ends_with_the_verdicts_and_marks_cells_that_ignore_order():
    from results.report import console_summary

    none = [cell("none", s, 3.0 + s / 100, gain=0.0, signal="none") for s in range(3)]
    rope = [cell("rope", s, 2.0 + s / 100, gain=1.4) for s in range(3)]
    learned = [cell("learned", s, 3.0 + s / 100, gain=0.001) for s in range(3)]
    lines = console_summary(report(none + rope + learned)).splitlines()
    assert lines[0].split() == ["cell", "status", "val", "loss", "tokens/s", "order", "gain"]
    by_cell = {ln.split()[0]: ln for ln in lines[1:10]}  # a line of each scheme (its seeds' gains are equal)
    assert by_cell["pos=rope"].endswith("1.400")
    assert by_cell["pos=learned"].endswith("0.001 ⚠ not yet using order")
    assert by_cell["pos=none"].endswith("0.000 (NoPE, bidirectional: none by construction)")
    found = verdicts(report(none + rope + learned).groups, 0.05)
    assert lines[-3] == headline(found, 0.05)
    rope_v = next(v for v in found if v.group.pos == "rope")
    assert lines[-2] == f"  rope vs none (softmax): lower: {rope_v.text}"
    assert lines[-1] == (
        "  learned vs none (softmax): premature — train longer: order gain 0.001 < 0.05, "
        "not yet using word order; one validation: no trend measured (log more: "
        "trainer.val_check_interval)"
    )


def test_the_level_the_sweep_recorded_when_it_started_is_the_reports(monkeypatch):
    """report.alpha=0.01 (and report.margin) on the command line is tagged on the sweep's parent run at its start
    (with report.baseline: harness/sweep/callback.py), and the report reads its level and margin back from there."""
    import argparse

    import results.store as store
    from results.cells import ALPHA_TAG, BASELINE_TAG, GAIN_TAG, MARGIN_TAG

    monkeypatch.setattr(store, "cells_of", lambda client, sweep, windows=False: [])
    recorded = ({ALPHA_TAG: "0.01", BASELINE_TAG: "", MARGIN_TAG: "0.02"}, 0.01, 0.02)
    for tags, alpha, margin in (recorded, ({MARGIN_TAG: ""}, 0.05, None), ({}, 0.05, None)):  # {}: from before
        parent = argparse.Namespace(
            data=argparse.Namespace(tags=tags), info=argparse.Namespace(run_id="p", status="FINISHED")
        )
        sweep = argparse.Namespace(experiment="e", sweep_id="s", parent=parent, runs=[], title="t")
        read = store.sweep_report(None, sweep)
        assert (read.alpha, read.margin) == (alpha, margin)
    # report.min_order_gain likewise: a rebuild (results report, results paper's embedded one) judges at the sweep's
    parent.data.tags = {GAIN_TAG: "0.2"}
    assert store.sweep_report(None, sweep).min_order_gain == 0.2
    assert "--min-order-gain" not in store.sweep_report(None, sweep).header[2]  # the record carries it
    given = store.sweep_report(None, sweep, min_order_gain=0.05)  # a threshold given after the run: said
    assert given.min_order_gain == 0.05 and " --min-order-gain 0.05 " in given.header[2]
