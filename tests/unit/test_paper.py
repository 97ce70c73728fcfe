"""Paper-claim reports: the statistics against textbook values, verdict rules, and one preset end to end."""

import argparse

import pytest

from harness.stats import minimum_detectable_effect, welch_p_value
from results.cells import Cell
from results.paper import (
    PREMATURE,
    Outcome,
    compare,
    in_arm,
    in_distribution_metric,
    overall,
    readiness,
    welch_interval,
)
from tests.helpers import ROOT, assert_figure


def test_welch_interval_matches_the_textbook_formula():
    a, b = [1.0, 2.0, 3.0], [4.0, 6.0, 8.0, 10.0]
    diff, low, high = welch_interval(a, b)
    # means 2 and 7; variances 1 and 20/3; se² = 1/3 + 5/3 = 2; Welch df = 4 / (1/18 + 25/27) = 4.0755…
    df = 4 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3)
    from scipy import stats

    half = stats.t.ppf(0.975, df) * 2**0.5
    assert diff == -5.0 and low == pytest.approx(-5 - half) and high == pytest.approx(-5 + half)
    assert welch_interval([1.0], [2.0, 3.0]) is None  # one seed: no interval


@pytest.mark.parametrize(
    "lower, than, verdict",
    [
        ([1.0, 1.1, 1.05], [2.0, 2.1, 2.05], "supports"),
        ([2.0, 2.1, 2.05], [1.0, 1.1, 1.05], "contradicts"),
        ([1.0, 2.0, 1.5], [1.2, 1.9, 1.4], "inconclusive"),
    ],
)
def test_comparison_verdicts(lower, than, verdict):
    c = {"metric": "val/loss", "lower": "pos=rope", "than": "pos=learned"}
    assert compare(c, {"pos=rope": lower, "pos=learned": than}).verdict == verdict


@pytest.mark.parametrize(
    "first, other, verdict",
    [
        ([1.0, 2.0, 3.0], [1.1, 2.12, 3.09], "supports"),  # a wide spread across seeds, a steady paired gap
        ([1.1, 2.12, 3.09], [1.0, 2.0, 3.0], "contradicts"),
        ([1.0, 2.0, 3.0], [1.1, 1.9, 3.0], "inconclusive"),
    ],
)
def test_paired_comparisons_of_two_metrics_of_the_same_models(first, other, verdict):
    c = {"metric": "val/yarn/loss_at_256", "lower_than_metric": "val/ntk/loss_at_256", "cell": "pos=rope"}
    outcome = compare(c, {"val/yarn/loss_at_256": first, "val/ntk/loss_at_256": other})
    assert outcome.verdict == verdict and "paired by seed" in outcome.text
    # Welch on the same numbers cannot see the steady gap under the spread between seeds
    assert welch_interval(first, other)[1] < 0 < welch_interval(first, other)[2]


def test_paired_interval_matches_the_textbook_formula():
    from scipy import stats

    from harness.stats import paired_interval

    a, b = [3.0, 5.0, 4.0, 6.0], [1.0, 2.0, 2.0, 3.0]  # d = 2, 3, 2, 3: mean 2.5, sd √(1/3)
    diff, low, high = paired_interval(a, b)
    half = stats.t.ppf(0.975, 3) * (1 / 3) ** 0.5 / 2
    assert diff == 2.5 and low == pytest.approx(2.5 - half, abs=1e-12) and high == pytest.approx(2.5 + half, abs=1e-12)
    assert paired_interval([1.0], [2.0]) is None


def test_paired_values_keep_each_seeds_two_metrics_together():
    from types import SimpleNamespace

    from results.paper import arm_values

    metrics = {"r0": {"a": 1.0, "b": 2.0}, "r1": {"a": 3.0}, "r2": {"a": 5.0, "b": 4.0}, "r3": {"a": 0.0, "b": 0.0}}
    client = SimpleNamespace(get_run=lambda rid: SimpleNamespace(data=SimpleNamespace(metrics=metrics[rid])))
    cells = [
        SimpleNamespace(run_id=rid, task="", finished=rid != "r3", label=f"pos=rope seed={i}")
        for i, rid in enumerate(metrics)
    ]
    c = {"metric": "a", "lower_than_metric": "b", "cell": "pos=rope"}
    assert arm_values(client, cells, c) == {"a": [1.0, 5.0], "b": [2.0, 4.0]}  # r1 lacks b, r3 unfinished


def test_a_mixture_parts_metric_is_read_from_a_run_trained_on_that_task_alone():
    """The claim of randomized_positions names ``val/reverse/token_acc_at_12`` (its task=mixture's part); the same
    preset swept with ``task=reverse`` logs ``val/token_acc_at_12``: the run's own name for the same measure, not
    "not measured"; a run of another task still has none of it, and a mixture's run keeps its prefixed name."""
    from types import SimpleNamespace

    from results.cells import Cell, own_metric
    from results.paper import arm_values, readiness

    def cell(rid, task, arm):
        return Cell(
            run_id=rid,
            name=rid,
            label=f"{arm} seed={rid[-1]}",
            pos="rope",
            attn="softmax",
            seed=rid[-1],
            status="finished",
            task=task,
            metrics=metrics[rid],
        )

    metrics = {
        "a0": {"val/token_acc_at_12": 0.5, "val/token_acc": 0.3},
        "a1": {"val/token_acc_at_12": 0.6, "val/token_acc": 0.4},
        "b0": {"val/token_acc_at_12": 0.2, "val/token_acc": 1.0, "val/reverse/token_acc_at_12": 9.0},
        "c0": {"val/reverse/token_acc_at_12": 0.7, "val/reverse/token_acc": 1.0},
    }
    cells = [
        cell("a0", "reverse", "+arm=r"),
        cell("a1", "reverse", "+arm=r"),
        cell("b0", "copy", "+arm=o"),
        cell("c0", "mixture", "+arm=m"),
    ]
    assert own_metric(cells[0], "val/reverse/token_acc_at_12") == "val/token_acc_at_12"
    assert own_metric(cells[0], "val/copy/token_acc_at_12") == "val/copy/token_acc_at_12"
    assert own_metric(cells[0], "val/loss") == "val/loss"
    assert own_metric(cells[3], "val/reverse/acc") == "val/reverse/acc"
    client = SimpleNamespace(get_run=lambda rid: SimpleNamespace(data=SimpleNamespace(metrics=metrics[rid])))
    c = {"metric": "val/reverse/token_acc_at_12", "higher": "+arm=r", "than": "+arm=o"}
    assert arm_values(client, cells, c) == {"+arm=r": [0.5, 0.6], "+arm=o": [9.0]}  # b0 is copy's: its own key
    assert arm_values(client, cells, dict(c, higher="+arm=m"))["+arm=m"] == [0.7]
    # readiness asks the same run's in-distribution per-token accuracy under its own name: 0.35 < 0.99
    assert "in-distribution reverse per-token accuracy 0.350" in readiness(cells, c, 0.0)["+arm=r"]


def test_minus_compares_each_seeds_growth_between_two_metrics():
    """{metric, minus}: per seed metric − minus within each arm, then Welch across arms (e.g. loss growth 1×→8×)."""
    from types import SimpleNamespace

    from results.paper import arm_values

    metrics = {
        "a0": {"long": 3.0, "short": 2.0},
        "a1": {"long": 3.2, "short": 2.1},
        "b0": {"long": 2.9, "short": 2.5},
        "b1": {"long": 3.0, "short": 2.7},
        "b2": {"long": 1.0},
    }
    client = SimpleNamespace(get_run=lambda rid: SimpleNamespace(data=SimpleNamespace(metrics=metrics[rid])))
    cells = [
        SimpleNamespace(run_id=rid, task="", finished=True, label=f"pos={rid[0]} seed={rid[1]}") for rid in metrics
    ]
    c = {"metric": "long", "minus": "short", "lower": "pos=b", "than": "pos=a"}
    values = arm_values(client, cells, c)
    assert values["pos=a"] == pytest.approx([1.0, 1.1]) and values["pos=b"] == pytest.approx([0.4, 0.3])  # b2: no short
    outcome = compare(c, values)
    diff, low, high = welch_interval([0.4, 0.3], [1.0, 1.1])
    assert outcome.text.startswith(f"(long − short): pos=b − pos=a = {diff:+.4f}") and outcome.verdict == "supports"


def test_higher_is_better_comparisons():
    c = {"metric": "val/acc_at_80", "higher": "pos=none", "than": "pos=rope"}
    assert compare(c, {"pos=none": [0.9, 0.92, 0.91], "pos=rope": [0.1, 0.12, 0.11]}).verdict == "supports"
    assert compare(c, {"pos=none": [0.1, 0.12, 0.11], "pos=rope": [0.9, 0.92, 0.91]}).verdict == "contradicts"


def test_minimum_detectable_effect_matches_the_formula():
    a, b = [1.0, 2.0, 3.0], [4.0, 6.0, 8.0, 10.0]  # se² = 2, Welch df as in the interval test above
    from scipy import stats

    df = 4 / ((1 / 3) ** 2 / 2 + (5 / 3) ** 2 / 3)
    want = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * 2**0.5
    assert minimum_detectable_effect(a, b) == pytest.approx(want, rel=1e-12)
    assert minimum_detectable_effect([1.0], b) is None
    c = {"metric": "val/loss", "lower": "pos=rope", "than": "pos=learned"}
    text = compare(c, {"pos=rope": a, "pos=learned": b}).text
    assert f"detectable |Δ| ≥ {want:.4f} at 80 % power" in text


def cell(
    label: str, gain: float | None, acc: float | None = None, signal: str = "scheme", token_acc: float | None = None
) -> Cell:
    metrics = {
        k: v for k, v in (("val/order_gain", gain), ("val/acc", acc), ("val/token_acc", token_acc)) if v is not None
    }
    return Cell("id", label, label, "p", "a", "0", "finished", metrics=metrics, order_signal=signal)


def test_models_not_using_order_make_a_comparison_premature_never_not_reproduced():
    c = {"metric": "val/loss", "lower": "pos=rope", "than": "pos=learned"}
    cells = [cell("pos=rope", 0.5), cell("pos=learned", 0.01), cell("pos=learned", 0.02)]
    unready = readiness(cells, c, min_gain=0.05)
    assert set(unready) == {"pos=learned"} and "order gain 0.015 < 0.05" in unready["pos=learned"]
    losing = {"pos=rope": [2.0, 2.1, 2.05], "pos=learned": [1.0, 1.1, 1.05]}  # would contradict the claim
    assert compare(c, losing).verdict == "contradicts"
    outcome = compare(c, losing, unready)
    assert outcome.verdict == "premature" and "not yet using word order" in outcome.text
    assert overall([outcome, Outcome("", "supports")]) == PREMATURE == "premature — train longer"
    assert overall([outcome, Outcome("", "contradicts")]) == "not reproduced"  # a ready contradiction still counts


def test_nope_bidirectional_is_exempt_and_low_accuracy_is_premature():
    c = {"metric": "val/acc_at_80", "higher": "pos=none", "than": "pos=rope"}
    cells = [cell("pos=none", 0.0, acc=1.0, signal="none"), cell("pos=rope", 0.4, acc=0.95)]
    unready = readiness(cells, c, min_gain=0.05)
    assert set(unready) == {"pos=rope"} and "in-distribution accuracy 0.950 < 0.99" in unready["pos=rope"]


def test_a_claim_on_per_token_accuracy_asks_the_training_lengths_of_per_token_accuracy():
    """Ruoss et al. 2023 score per output token: models that get 99.5 % of the training lengths' answer
    tokens right are ready for a per-token claim, while their exact match (0.6) still makes an exact-match
    claim premature."""
    cells = [cell("pos=rope", 0.4, acc=0.6, token_acc=0.995), cell("pos=none", 0.4, acc=0.6, token_acc=0.98)]
    per_token = {"metric": "val/token_acc_at_80", "higher": "pos=rope", "than": "pos=none"}
    exact = {"metric": "val/acc_at_80", "higher": "pos=rope", "than": "pos=none"}
    unready = readiness(cells, per_token, min_gain=0.05)
    assert set(unready) == {"pos=none"} and "in-distribution per-token accuracy 0.980 < 0.99" in unready["pos=none"]
    assert set(readiness(cells, exact, min_gain=0.05)) == {"pos=rope", "pos=none"}


def test_a_claim_on_a_mixture_part_asks_that_part_its_training_lengths():
    """task=mixture trains several tasks in one run: a claim on reverse (val/reverse/token_acc_at_16) asks the
    arms' reverse at the training lengths (val/reverse/token_acc), not the pooled val/token_acc nor copy's."""

    def part_cell(label, reverse, copy):
        return Cell(
            "id",
            label,
            label,
            "p",
            "a",
            "0",
            "finished",
            order_signal="scheme",
            metrics={
                "val/order_gain": 0.4,
                "val/token_acc": 0.999,
                "val/reverse/token_acc": reverse,
                "val/copy/token_acc": copy,
                "val/reverse/acc": 0.5,
            },
        )

    cells = [part_cell("pos=rope", 0.995, 0.90), part_cell("pos=none", 0.97, 1.0)]
    on_reverse = {"metric": "val/reverse/token_acc_at_16", "higher": "pos=rope", "than": "pos=none"}
    on_copy = {"metric": "val/copy/token_acc_at_16", "higher": "pos=rope", "than": "pos=none"}
    unready = readiness(cells, on_reverse, min_gain=0.05)
    assert set(unready) == {"pos=none"} and "in-distribution reverse per-token accuracy 0.970" in unready["pos=none"]
    assert set(readiness(cells, on_copy, min_gain=0.05)) == {"pos=rope"}
    assert set(readiness(cells, dict(on_reverse, metric="val/reverse/acc_at_16"), min_gain=0.05)) == {
        "pos=rope",
        "pos=none",
    }  # exact match of the part: 0.5


@pytest.mark.parametrize(
    ("metric", "asked"),
    [
        ("val/acc_at_16", "val/acc"),
        ("val/token_acc_at_80", "val/token_acc"),
        ("val/sort/acc_at_12", "val/sort/acc"),
        ("val/missing_duplicate/token_acc_at_24", "val/missing_duplicate/token_acc"),
        ("val/loss", "val/acc"),
        ("val/blind_token_acc_at_16", "val/acc"),
        ("val/loss_at_16", "val/acc"),
    ],
)
def test_the_in_distribution_metric_of_a_comparison(metric, asked):
    assert in_distribution_metric(metric) == asked


def test_threshold_comparison_and_overall_rule():
    c = {"metric": "pos/theta_rel_change", "below": 0.05, "cell": "pos=rope_trainable"}
    assert compare(c, {"pos=rope_trainable": [0.01, 0.02]}).verdict == "supports"
    assert compare(c, {"pos=rope_trainable": [0.01, 0.2]}).verdict == "inconclusive"
    assert compare(c, {"pos=rope_trainable": [0.1, 0.2]}).verdict == "contradicts"
    s, c_, i = Outcome("", "supports"), Outcome("", "contradicts"), Outcome("", "inconclusive")
    assert (
        overall([s, s]) == "reproduced" and overall([s, i]) == "inconclusive" and overall([s, c_]) == "not reproduced"
    )


def test_secondary_comparisons_are_reported_but_do_not_decide_the_verdict(tmp_path, monkeypatch):
    """A claim's ``also`` list shows up in the comparisons table, marked secondary; the verdict
    comes from ``comparisons`` alone (here one supported comparison, one contradicted secondary)."""
    import results.paper as paper
    import results.report as report
    import results.store as store

    class Cell:
        def __init__(self, label, loss):
            self.label, self.finished, self.final_loss, self.run_id = label, True, loss, label
            self.order_gain, self.metrics, self.order_signal = 1.0, {}, "scheme"  # models that use order
            self.task = ""

    cells = [
        Cell(f"pos={p} seed={s}", loss)
        for p, losses in {"rope": [1.0, 1.1, 1.05], "learned": [2.0, 2.1, 2.05], "none": [3.0, 3.1, 3.05]}.items()
        for s, loss in enumerate(losses)
    ]
    monkeypatch.setattr(store, "sweep_report", lambda client, sweep, **kw: None)
    monkeypatch.setattr(report, "write_report", lambda r, out: (out / "report.md").write_text("# r\nbody\n"))
    monkeypatch.setattr(store, "cells_of", lambda client, sweep: cells)
    sweep = argparse.Namespace(runs=[], sweep_id="s1")
    claim = {
        "source": "src",
        "statement": "st",
        "comparisons": [{"metric": "val/loss", "lower": "pos=rope", "than": "pos=learned"}],
        "also": [{"metric": "val/loss", "lower": "pos=none", "than": "pos=rope"}],
    }
    verdict = paper.write_paper_report(None, sweep, "demo", "toy", claim, tmp_path / "demo")
    assert "val/loss: pos=rope − pos=learned = -1.0000" in (tmp_path / "demo" / "README.md").read_text()
    readme = (tmp_path / "demo" / "README.md").read_text()
    assert verdict == "reproduced"
    assert "val/loss: pos=none − pos=rope = +2.0000" in readme
    assert "(secondary: not part of the verdict) | contradicts |" in readme


SWEEP_REPORT = (
    "# sweep\nExperiment `e`.\n\n**Verdict on 2 comparisons: 1 lower and 0 higher than their baseline "
    "beyond seed noise; 1 inconclusive.**\n\n## Scheme × attention\n\n| table |\n\n## Verdicts\n\nVerdict on 2 "
    "comparisons: …\n\n| cell | verdict |\n\n## Cells\n\n| cells |\n"
)


@pytest.mark.parametrize("metric,kept", [("val/acc_at_12", False), ("val/loss", True)])
def test_a_paper_report_has_one_verdict_the_claims(metric, kept, tmp_path, monkeypatch):
    """The sweep's own loss-vs-baseline headline never appears beside the claim's verdict; its Verdicts section
    stays only where the claim is judged on val/loss, titled as what it is."""
    import results.paper as paper
    import results.report as report
    import results.store as store

    class Cell:
        def __init__(self, label, value):
            self.label, self.finished, self.final_loss, self.run_id = label, True, value, label
            self.order_gain, self.metrics, self.order_signal, self.task = 1.0, {metric: value}, "scheme", ""

    values = {"rope": [0.1, 0.12, 0.11], "none": [0.9, 0.92, 0.91]}
    cells = [Cell(f"pos={p} seed={s}", v) for p, vs in values.items() for s, v in enumerate(vs)]
    by_id = {c.run_id: c for c in cells}
    client = argparse.Namespace(
        get_run=lambda rid: argparse.Namespace(data=argparse.Namespace(metrics=by_id[rid].metrics))
    )
    monkeypatch.setattr(store, "sweep_report", lambda c, sweep, **kw: None)
    monkeypatch.setattr(report, "write_report", lambda r, out: (out / "report.md").write_text(SWEEP_REPORT))
    monkeypatch.setattr(store, "cells_of", lambda c, sweep: cells)
    monkeypatch.setattr(paper, "readiness", lambda *a, **kw: {})
    claim = {
        "source": "src",
        "statement": "st",
        "comparisons": [{"metric": metric, "lower": "pos=rope", "than": "pos=none"}],
    }
    paper.write_paper_report(client, argparse.Namespace(runs=[], sweep_id="s1"), "demo", "toy", claim, tmp_path / "d")
    readme = (tmp_path / "d" / "README.md").read_text()
    assert [line for line in readme.splitlines() if "Verdict" in line and line.startswith("**")] == [
        line for line in readme.splitlines() if line.startswith("**Verdict: ")
    ]
    assert "## Scheme × attention" in readme and "## Cells" in readme
    assert ("### Final val loss against the sweep's baseline (not the claim's verdict)" in readme) == kept
    assert "## Verdicts" not in readme


def test_grid_section_compares_each_scheme_with_none_under_the_same_attention(tmp_path):
    """Δ against pos=none of the same attn, its Welch interval, the better/≈/worse mark, refusals."""
    from results.cells import Cell
    from results.grid import grid_section

    losses = {
        ("none", "softmax"): [3.0, 3.1, 3.2],
        ("rope", "softmax"): [2.0, 2.1, 2.2],
        ("learned", "softmax"): [3.0, 3.2, 3.1],
        ("none", "linear"): [3.0, 3.0, 3.3],
        ("rope", "linear"): [3.5, 3.6, 3.7],
    }
    cells = [
        Cell(f"r{pos}{attn}{s}", "n", f"pos={pos} attn={attn} seed={s}", pos, attn, str(s), "finished", val=[(100, x)])
        for (pos, attn), xs in losses.items()
        for s, x in enumerate(xs)
    ]
    cells.append(
        Cell(
            "rx",
            "n",
            "pos=xl attn=linear seed=0",
            "xl",
            "linear",
            "0",
            "incompatible",
            reason="kernelized attention never forms the logit",
        )
    )
    lines = grid_section(None, cells, tmp_path)
    text = "\n".join(lines)
    from harness.stats import welch_p_value

    diff, low, high = welch_interval([2.0, 2.1, 2.2], [3.0, 3.1, 3.2])
    p = welch_p_value([2.0, 2.1, 2.2], [3.0, 3.1, 3.2])
    worse = welch_p_value([3.5, 3.6, 3.7], [3.0, 3.0, 3.3])
    assert p < 0.05 / 3 and worse < 0.05 / 2  # Holm over the three: both rejected, learned (p = 1) not
    assert f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] p={p:.1g} better (n=3)" in text
    assert "| pos | attn=linear | attn=softmax |" in text  # columns and rows sorted
    learned = text.split("| learned |")[1].splitlines()[0]
    assert learned.startswith(" — | +0.000 [") and learned.endswith("] p=1 ≈ (n=3) |")
    row = text.split("| rope |")[1].splitlines()[0]
    assert row.endswith(
        f"] p={worse:.1g} worse (n=3) | " + f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] p={p:.1g} better (n=3) |"
    )
    assert "| xl | refused | — |" in text
    assert "Holm's step-down procedure over the grid's 3 cells with an interval rejects at family-wise α = 0.05" in text
    assert "1 of 3 cells beat `pos=none` beyond seed noise (Holm-corrected), 1 are worse, 1 are within noise." in text
    assert "Refused (xl×linear): kernelized attention never forms the logit" in text
    assert_figure(tmp_path / "grid_delta.png")


def test_an_arm_fixed_by_the_preset_matches_cells_labelled_by_seed_only():
    """rope_scaling fixes pos: rope and sweeps seeds: its cells are labelled seed=N and are still pos=rope."""
    fixed = Cell("id", "n", "seed=1", "rope", "softmax", "1", "finished")
    assert in_arm(fixed, "pos=rope") and in_arm(fixed, "pos=rope attn=softmax") and in_arm(fixed, "seed=1")
    assert not in_arm(fixed, "pos=t5") and not in_arm(fixed, "task=copy pos=rope")
    swept = Cell("id", "n", "task=copy pos=rope seed=0", "rope", "softmax", "0", "finished")
    assert in_arm(swept, "task=copy pos=rope") and not in_arm(swept, "task=reverse pos=rope")


def test_grid_section_says_what_each_cell_learned_and_flags_cells_not_using_order(tmp_path):
    from results.cells import Cell
    from results.grid import grid_section

    def one(pos, attn, s, gain, acc, signal="scheme"):
        return Cell(
            f"r{pos}{attn}{s}",
            "n",
            f"pos={pos} attn={attn} seed={s}",
            pos,
            attn,
            str(s),
            "finished",
            val=[(100, 1.0 - gain / 10)],
            metrics={"val/order_gain": gain, "val/acc": acc},
            order_signal=signal,
        )

    cells = [one("none", "softmax", s, 0.0, 0.0, "none") for s in range(2)]
    cells += [one("rope", "softmax", s, 2.0 + s, 1.0) for s in range(2)]
    cells += [one("learned", "softmax", s, 0.01, 0.25) for s in range(2)]
    text = "\n".join(grid_section(None, cells, tmp_path))
    assert "| none | acc 0.000, no order signal |" in text
    assert "| rope | acc 1.000, gain 2.50 |" in text
    assert "| learned | acc 0.250, gain 0.01 ⚠ not yet using order |" in text
    assert "2 of 3 trained cells use word order or cannot (pos=none); 1 do not yet: learned×softmax." in text


def test_grid_section_names_the_family_its_marks_were_decided_in_a_premature_cell_included(tmp_path):
    """learned is premature (order gain 0) but has two seeds a side, so its hypothesis is one of the verdicts' Holm
    family: rope's p = 0.04 is not rejected at 0.05 / 2, and the text names that family of 2, not 1."""
    from results.cells import Cell
    from results.grid import grid_section

    def one(pos, s, x, gain, signal="scheme"):
        return Cell(
            f"r{pos}{s}",
            "n",
            f"pos={pos} seed={s}",
            pos,
            "softmax",
            str(s),
            "finished",
            val=[(100, x)],
            metrics={"val/order_gain": gain},
            order_signal=signal,
        )

    cells = [one("none", s, x, 0.0, "none") for s, x in enumerate([3.0, 3.1, 3.2])]
    cells += [one("rope", s, x, 1.0) for s, x in enumerate([2.75, 2.85, 2.95])]
    cells += [one("learned", s, x, 0.0) for s, x in enumerate([3.0, 3.1, 3.2])]
    text = "\n".join(grid_section(None, cells, tmp_path))
    assert 0.05 / 2 < welch_p_value([2.75, 2.85, 2.95], [3.0, 3.1, 3.2]) < 0.05
    assert "p=0.04 ≈ (n=3)" in text and "premature (n=3)" in text
    assert "Holm's step-down procedure over the grid's 2 cells with an interval rejects" in text
    assert "outside the family" not in text


def test_grid_section_with_one_seed_shows_the_difference_without_an_interval(tmp_path):
    """scale=smoke runs one seed: Δ is shown, marked as having no interval, and not counted as a separation."""
    from results.cells import Cell
    from results.grid import grid_section

    cells = [
        Cell(f"r{p}", "n", f"pos={p} attn=softmax seed=0", p, "softmax", "0", "finished", val=[(100, x)])
        for p, x in (("none", 0.5), ("rope", 0.2))
    ]
    cells.append(
        Cell(
            "rl",
            "n",
            "pos=rope attn=local seed=0",
            "rope",
            "local",
            "0",
            "incompatible",
            reason="attn.window=32 exceeds the longest sequence",
        )
    )
    text = "\n".join(grid_section(None, cells, tmp_path))
    assert "| rope | refused | -0.300 (no interval: one seed) |" in text
    assert (
        "0 of 0 cells beat `pos=none` beyond seed noise (Holm-corrected), 0 are worse, 0 are within noise; 1 have "
        "too few" in text
    )


def test_the_paper_command_judges_at_the_threshold_and_level_the_sweep_ran_with(monkeypatch, tmp_path):
    """`python run.py -m experiment=drope report.min_order_gain=0.2 report.alpha=0.01` records both on its parent
    run; `python -m results paper --preset drope` judges the claim at them, not at the preset's 0.05 and 0.05."""
    import results.paper as paper
    import results.store as store
    from results.cells import ALPHA_TAG, GAIN_TAG

    judged = {}
    parent = argparse.Namespace(data=argparse.Namespace(tags={GAIN_TAG: "0.2", ALPHA_TAG: "0.01"}))
    monkeypatch.setattr(store, "open_store", lambda uri: ("sqlite://", None))
    monkeypatch.setattr(store, "find_sweep", lambda client, experiment, sweep_id: argparse.Namespace(parent=parent))
    monkeypatch.setattr(paper, "write_paper_report", lambda *a, **kw: judged.update(a[4]) or "inconclusive")
    args = argparse.Namespace(preset="drope", scale="toy", sweep=None, tracking_uri=None, out=str(tmp_path / "d"))
    assert paper.main(args) == 0 and (judged["min_order_gain"], judged["alpha"]) == (0.2, 0.01)
    parent.data.tags = {}  # a sweep from before the threshold was recorded: the preset's
    assert paper.main(args) == 0 and (judged["min_order_gain"], judged["alpha"]) == (0.05, 0.05)


def test_grid_section_keeps_a_variant_axis_apart(tmp_path):
    """A sweep over model.n_layers as well as pos: each variant is a column of its own, compared with pos=none of
    the same attention and variant, never the seeds of both pooled into one cell."""
    from results.cells import Cell
    from results.grid import grid_section

    losses = {("none", 2): [3.0, 3.1, 3.2], ("rope", 2): [2.0, 2.1, 2.2], ("none", 4): [1.0, 1.1, 1.2]}
    losses[("rope", 4)] = losses[("rope", 2)]
    cells = [
        Cell(f"r{p}{v}{s}", "n", "", p, "softmax", str(s), "finished", variant=f"model.n_layers={v}", val=[(100, x)])
        for (p, v), xs in losses.items()
        for s, x in enumerate(xs)
    ]
    text = "\n".join(grid_section(None, cells, tmp_path))
    assert "| pos | attn=softmax model.n_layers=2 | attn=softmax model.n_layers=4 |" in text
    assert "| rope | -1.000 [" in text and "] p=0.0003 better (n=3) | +1.000 [" in text and "worse (n=3) |" in text


def test_the_report_says_where_randomized_cells_were_evaluated():
    from results.cells import Cell
    from results.paper import evaluation_positions
    from results.store import _sampling

    assert _sampling({"pos.randomize": "False", "pos.eval_positions": "None"}) == {}
    sampled = _sampling({"pos.randomize": "True", "pos.eval_positions": "None", "pos.max_position": "64"})
    ordered = _sampling({"pos.randomize": "True", "pos.eval_positions": "ordered", "pos.max_position": "64"})
    assert sampled == {"eval_positions": "sampled", "max_position": 64} and ordered["eval_positions"] == "ordered"

    def cell(**sampling):
        return Cell(
            run_id="r", name="n", label="l", pos="rope", attn="softmax", seed="0", status="finished", **sampling
        )

    assert evaluation_positions([cell(), cell()]) == []  # nothing randomized: nothing to say
    line = evaluation_positions([cell(), cell(**sampled)])[0]
    assert (
        "a fresh sorted sample of positions per forward (`pos.eval_positions=sampled`" in line
        and "max_position 64" in line
        and "the others at 0 … T−1" in line
    )
    both = evaluation_positions([cell(**sampled), cell(**ordered)])[0]
    assert "`pos.eval_positions=ordered`" in both and "`pos.eval_positions=sampled`" in both


def test_where_a_claim_starts_to_hold_along_the_scale_axis():
    from results.paper import PREMATURE, along_scale

    assert (
        along_scale({"toy": PREMATURE, "toy2x": "inconclusive", "toy4x": "reproduced"})
        == f"holds from scale toy4x (toy: {PREMATURE}; toy2x: inconclusive; toy4x: reproduced)"
    )
    assert along_scale({"toy": "reproduced", "toy2x": "inconclusive", "toy4x": "reproduced"}).startswith(
        "holds from scale toy4x"
    )  # held at toy, lost at 2×: it holds from where it holds at every larger scale
    assert (
        along_scale({"toy": "not reproduced", "toy2x": "not reproduced"})
        == "not reproduced at every scale (toy, toy2x): does not move with scale here"
    )
    assert (
        along_scale({"toy": "reproduced", "toy2x": "not reproduced"})
        == "changes with scale without holding: toy: reproduced; toy2x: not reproduced"
    )


def test_a_sweep_over_scale_gets_a_verdict_per_scale_from_that_scales_cells_alone(tmp_path, monkeypatch):
    import results.paper as paper
    import results.report as report
    import results.store as store

    class Cell:
        def __init__(self, label, loss):
            self.label, self.finished, self.final_loss, self.run_id = label, True, loss, label
            self.order_gain, self.metrics, self.order_signal, self.task = 1.0, {}, "scheme", ""

    losses = {
        ("toy", "rope"): [2.0, 2.1, 2.05],
        ("toy", "learned"): [1.0, 1.1, 1.05],  # toy: the claim fails
        ("toy2x", "rope"): [1.0, 1.1, 1.05],
        ("toy2x", "learned"): [2.0, 2.1, 2.05],
    }  # 2×: it holds
    cells = [
        Cell(f"pos={p} seed={i} scale={s}", loss) for (s, p), seeds in losses.items() for i, loss in enumerate(seeds)
    ]
    monkeypatch.setattr(store, "sweep_report", lambda client, sweep, **kw: None)
    monkeypatch.setattr(report, "write_report", lambda r, out: (out / "report.md").write_text("# r\nb\n"))
    monkeypatch.setattr(store, "cells_of", lambda client, sweep: cells)
    claim = {
        "source": "src",
        "statement": "st",  # the second comparison's arm is not in this sweep: it drops out
        "comparisons": [
            {"metric": "val/loss", "lower": "pos=rope", "than": "pos=learned"},
            {"metric": "val/loss", "lower": "pos=alibi", "than": "pos=learned"},
        ],
    }
    sweep = argparse.Namespace(runs=[], sweep_id="s1")
    verdict = paper.write_paper_report(None, sweep, "demo", "toy,toy2x", claim, tmp_path / "demo")
    assert verdict == (
        "holds from scale toy2x (toy: not reproduced; toy2x: reproduced), on 1 of the claim's 2 "
        "primary comparisons (the others' arms or metrics were not trained in this sweep)"
    )
    readme = (tmp_path / "demo" / "README.md").read_text()
    assert f"**Verdict: {verdict}.**" in readme and "scale=toy,toy2x`" in readme
    assert "| toy | not reproduced | val/loss: pos=rope − pos=learned = +1.0000" in readme  # n = 3 vs 3 each
    assert "| toy2x | reproduced | val/loss: pos=rope − pos=learned = -1.0000" in readme


def test_a_scale_sweep_pinned_on_the_command_line_matches_arms_that_name_the_pinned_values(tmp_path, monkeypatch):
    """``python run.py -m experiment=X task=reverse scale=toy,toy2x``: the cells' labels name only what varies
    (``pos=rope seed=0 scale=toy``), yet the preset's arms say ``task=reverse pos=rope``."""
    import results.paper as paper
    import results.report as report
    import results.store as store

    class Cell:
        def __init__(self, label, loss):
            self.label, self.finished, self.final_loss, self.run_id = label, True, loss, label
            self.order_gain, self.metrics, self.order_signal, self.task = 1.0, {}, "scheme", ""

    cells = [
        Cell(f"pos={p} seed={i} scale={s}", loss + i / 20)
        for s in ("toy", "toy2x")
        for p, loss in (("rope", 1.0), ("learned", 2.0))
        for i in range(3)
    ]
    monkeypatch.setattr(store, "sweep_report", lambda client, sweep, **kw: None)
    monkeypatch.setattr(report, "write_report", lambda r, out: (out / "report.md").write_text("# r\nb\n"))
    monkeypatch.setattr(store, "cells_of", lambda client, sweep: cells)
    claim = {
        "source": "src",
        "statement": "st",
        "comparisons": [
            {"metric": "val/loss", "lower": "task=reverse pos=rope", "than": "task=reverse pos=learned"},
            {"metric": "val/loss", "lower": "task=copy pos=rope", "than": "task=copy pos=learned"},
        ],
    }  # not swept: drops
    tags = {"sweep_overrides": "experiment=demo task=reverse pos=rope,learned scale=toy,toy2x"}
    info = argparse.Namespace(start_time=0, end_time=None)
    parent = argparse.Namespace(data=argparse.Namespace(tags=tags), info=info)
    sweep = argparse.Namespace(runs=[], sweep_id="s1", parent=parent)
    verdict = paper.write_paper_report(None, sweep, "demo", "toy,toy2x", claim, tmp_path / "demo")
    assert verdict == (
        "reproduced at every scale (toy, toy2x): does not move with scale here, on 1 of the claim's "
        "2 primary comparisons (the others' arms or metrics were not trained in this sweep)"
    )
    assert (
        "Command: `python run.py -m experiment=demo task=reverse pos=rope,learned scale=toy,toy2x`"
        in (tmp_path / "demo" / "README.md").read_text()
    )


def test_the_committed_index_is_what_the_reports_say(tmp_path):
    """results/README.md is generated (python -m results index): it must name each committed report's own verdict
    line. A report copied in without regenerating the index left it saying "premature" where the report said
    "inconclusive"."""
    import shutil

    from results.paper import render_index

    committed = ROOT / "results"
    assert (committed / "README.md").read_text() == render_index(committed), "run: python -m results index"
    copy = tmp_path / "results"  # and a report's verdict line reaches the index: change one, the index follows
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("*.png", "*.csv", "*.json", "*.db", "SHA256SUMS"))
    report = copy / "roformer_mlm" / "README.md"
    lines = report.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("**Verdict"))
    lines[at] = "**Verdict: inconclusive at toy scale.** (edited)"
    report.write_text("\n".join(lines) + "\n")
    assert "| Verdict: inconclusive at toy scale. |" in render_index(copy).split("[roformer_mlm]")[1].splitlines()[0]


@pytest.mark.parametrize(
    "metric, a, b, verdict, said",
    [
        ("val/acc_at_12", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], "floor", "every seed of both arms is 0 — a floor"),
        ("val/copy/token_acc_at_12", [1.0, 1.0], [1.0, 1.0], "ceiling", "every seed of both arms is 1 — a ceiling"),
        ("val/loss_at_64", [2.5, 2.5], [2.5, 2.5], "no spread", "every seed of both arms is 2.5: no spread"),
    ],
)
def test_a_comparison_that_cannot_discriminate_is_named_and_left_out_of_the_verdict(metric, a, b, verdict, said):
    """The committed nope_length_generalization report called "+0.0000 (95 % CI +0.0000 … +0.0000; detectable
    |Δ| ≥ 0.0000 at 80 % power)" inconclusive: every arm was 0 exact match at 2×, a floor."""
    found = compare({"metric": metric, "higher": "pos=none", "than": "pos=rope"}, {"pos=none": a, "pos=rope": b})
    assert found.verdict == verdict and said in found.text and "detectable" not in found.text
    assert "left out of the verdict" in found.text
    supports = Outcome("", "supports")
    assert overall([supports, found]) == "reproduced"  # judged on the comparisons that can discriminate
    assert overall([found, found]) == "inconclusive"


def test_arms_without_spread_but_apart_keep_their_verdict_without_a_power_figure():
    found = compare(
        {"metric": "val/acc_at_12", "higher": "pos=none", "than": "pos=rope"},
        {"pos=none": [1.0, 1.0], "pos=rope": [0.0, 0.0]},
    )
    assert found.verdict == "supports" and "detectable" not in found.text


def test_welch_and_paired_p_values_match_scipys_tests():
    from scipy import stats

    from harness.stats import paired_p_value, welch_p_value

    a, b = [2.1, 2.4, 1.9, 2.2], [2.6, 2.5, 2.9]
    assert welch_p_value(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)
    c = [2.0, 2.6, 1.7, 2.5]
    assert paired_p_value(a, c) == pytest.approx(stats.ttest_rel(a, c).pvalue, rel=1e-12)
    assert welch_p_value([1.0], b) is None and welch_p_value([1.0, 1.0], [0.0, 0.0]) == 0.0


def test_holm_rejects_step_down_and_stops_at_the_first_that_fails():
    from harness.stats import holm

    # sorted 0.005 ≤ 0.05/4, 0.01 ≤ 0.05/3, then 0.03 > 0.05/2: stop (0.04 is not reached)
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.01, 0.04, 0.03, 0.005], 0.01) == [False] * 4  # 0.005 > 0.01/4
    assert holm([0.001, 0.04], 0.05) == [True, True] and holm([0.001, 0.04], 0.01) == [True, False]  # stricter
    assert holm([], 0.05) == []


def test_a_family_of_comparisons_is_decided_together():
    """Two comparisons at p = 0.03 and 0.04 each 'support' at 95 % alone; as a family of two, Holm rejects
    neither at α = 0.05 (0.03 > 0.025), so the claim is inconclusive, not reproduced by chance."""
    from results.paper import corrected, family_line

    found = [
        Outcome("a", "supports", 0.03, True),
        Outcome("b", "supports", 0.04, True),
        Outcome("c", "premature", 0.001, True),
        Outcome("d", "floor"),
    ]
    decided = corrected(found, 0.05)
    assert [o.verdict for o in decided] == ["inconclusive", "inconclusive", "premature", "floor"]
    assert overall(decided) == PREMATURE
    decided = corrected([Outcome("a", "supports", 0.001, True), Outcome("b", "inconclusive", 0.02, False)], 0.05)
    assert [o.verdict for o in decided] == ["supports", "contradicts"]  # 0.02 ≤ 0.05/1 after the first
    assert "Corrected for 2 hypotheses: Holm–Bonferroni at family-wise α = 0.05" in family_line(decided, 0.05)


def test_seeds_needed_is_the_least_n_whose_detectable_effect_reaches_the_difference():
    """minimum_detectable_effect solved for n: (t_{.975, 2n−2} + t_{.8, 2n−2})·√((s_a² + s_b²)/n) ≤ |Δ|."""
    import math
    import statistics

    from scipy import stats

    from harness.stats import seeds_needed

    a, b = [2.00, 2.10, 1.95], [2.05, 2.20, 2.02]
    diff = statistics.fmean(a) - statistics.fmean(b)
    n = seeds_needed(a, b, diff)

    def detectable(k: int) -> float:
        return (stats.t.ppf(0.975, 2 * k - 2) + stats.t.ppf(0.8, 2 * k - 2)) * math.sqrt(
            (statistics.variance(a) + statistics.variance(b)) / k
        )

    assert n is not None and detectable(n) <= abs(diff) < detectable(n - 1)
    assert seeds_needed(a, b, 0.0) is None and seeds_needed([1.0, 1.0], [1.0, 1.0], 0.5) is None
    assert seeds_needed(a, b, 1e-6) is None  # more than 1000 per arm
    found = compare({"metric": "val/loss", "lower": "pos=rope", "than": "pos=none"}, {"pos=rope": a, "pos=none": b})
    assert found.verdict == "inconclusive" and f"n ≥ {n} per arm would detect |Δ| = {abs(diff):.4f}" in found.text


def test_an_agreement_claims_p_values_are_two_one_sided_welch_tests_inside_and_both_sides_outside():
    """``close: A, to: B, within: m`` (harness/sequential.py): equivalence's p is TOST's (Schuirmann 1987), the larger
    of the one-sided Welch p-values of Δ > −m and Δ < m (scipy's ``ttest_ind`` on shifted arms); beyond's is the
    one-sided p of Δ past the margin on its side, doubled for the side read from the data."""
    from scipy import stats

    from harness.sequential import beyond_p, equivalence_p

    a, b, m = [2.01, 2.05, 1.98, 2.03], [2.02, 2.00, 2.04], 0.05

    def one_sided(b: list[float], shift: float, side: str) -> float:
        return stats.ttest_ind(a, [x + shift for x in b], equal_var=False, alternative=side).pvalue

    tost = max(one_sided(b, -m, "greater"), one_sided(b, m, "less"))
    assert equivalence_p(a, b, m) == pytest.approx(tost, rel=1e-12) and beyond_p(a, b, m) == 1.0
    far = [x + 0.2 for x in b]  # Δ ≈ −0.19: beyond −m
    assert beyond_p(a, far, m) == pytest.approx(2 * one_sided(far, -m, "less"), rel=1e-12)
    assert equivalence_p(a, far, m) > 0.5
    assert equivalence_p([1.0, 1.0], [1.02, 1.02], m) == 0.0 and beyond_p([1.0, 1.0], [1.02, 1.02], m) == 1.0


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ([2.01, 2.03, 2.00, 2.02], [2.02, 2.00, 2.03], "supports"),
        # inside the margin at p = 0.027: not below α / 2, the level of one of an agreement claim's two hypotheses
        ([2.01, 2.05, 1.98, 2.03], [2.02, 2.00, 2.04], "inconclusive (corrected)"),
        ([2.01, 2.05, 1.98, 2.03], [2.22, 2.20, 2.24], "contradicts"),
        ([2.01, 2.35, 1.70, 2.03], [2.02, 2.00, 2.04], "inconclusive"),
    ],
)
def test_an_equivalence_comparison_supports_inside_the_margin_and_contradicts_beyond_it(a, b, verdict):
    from results.paper import corrected

    comparison = {"metric": "val/loss", "close": "pos=rope_10", "to": "pos=rope", "within": 0.05}
    found = compare(comparison, {"pos=rope_10": a, "pos=rope": b})
    decided = corrected([found], 0.05)[0]
    assert decided.verdict == verdict.removesuffix(" (corrected)"), found.text
    assert "within ±0.05" in found.text and "p = " in found.text
    assert ("would settle it" in found.text) == (verdict == "inconclusive")  # uncorrected: p above α


def test_than_metric_reads_the_reference_arm_on_its_own_metric():
    """DroPE's protocol: the model without RoPE at 4× against the RoPE model under YaRN at 4× — one metric per arm."""
    from types import SimpleNamespace

    from results.paper import arm_values

    metrics = {
        "d0": {"val/loss_at_256": 2.0, "val/yarn/loss_at_256": 9.0},
        "d1": {"val/loss_at_256": 2.1},
        "r0": {"val/loss_at_256": 1.0, "val/yarn/loss_at_256": 2.5},
        "r1": {"val/loss_at_256": 1.1, "val/yarn/loss_at_256": 2.7},
    }
    client = SimpleNamespace(get_run=lambda rid: SimpleNamespace(data=SimpleNamespace(metrics=metrics[rid])))
    cells = [
        SimpleNamespace(run_id=rid, task="", finished=True, label=f"+arm={rid[0]} seed={rid[1]}") for rid in metrics
    ]
    c = {"metric": "val/loss_at_256", "lower": "+arm=d", "than": "+arm=r", "than_metric": "val/yarn/loss_at_256"}
    values = arm_values(client, cells, c)
    assert values == {"+arm=d": [2.0, 2.1], "+arm=r": [2.5, 2.7]}
    outcome = compare(c, values)
    assert outcome.text.startswith("val/loss_at_256: +arm=d − +arm=r (its val/yarn/loss_at_256) = -0.5500")


def test_a_metric_no_run_logged_is_not_measured_and_leaves_the_verdict():
    """A task override can rename a claim's metric (task=reverse logs val/token_acc_at_12, the mixture's claim reads
    val/reverse/token_acc_at_12): both arms empty is 'not measured', named, left out of the family — never 'too few
    seeds'; a claim none of whose comparisons was measured is 'not measured'."""
    comparison = {"metric": "val/reverse/token_acc_at_12", "higher": "+arm=r", "than": "+arm=o"}
    outcome = compare(comparison, {"+arm=r": [], "+arm=o": []})
    assert (
        outcome.verdict == "not measured"
        and "no finished run of either arm logged val/reverse/token_acc" in outcome.text
    )
    assert overall([outcome, outcome]) == "not measured"
    measured = compare({**comparison, "metric": "val/acc"}, {"+arm=r": [0.9, 0.95, 0.92], "+arm=o": [0.5, 0.4, 0.45]})
    assert overall([outcome, measured]) == overall([measured]) == "reproduced"


def test_an_agreement_claim_is_two_hypotheses_of_a_staged_family_whatever_its_numbers():
    """``claim_family`` gives an agreement claim its two hypotheses (equivalence and beyond) before any number is
    read; one at a ceiling, or with one seed, is still two of the family ``staged_line`` says was decided."""
    from harness.sequential import Design
    from results.paper import claim_family, staged_line

    close = {"metric": "val/acc", "close": "pos=a", "to": "pos=b", "within": 0.01}
    lower = {"metric": "val/loss", "lower": "pos=a", "than": "pos=b"}
    found = [
        compare(close, {"pos=a": [1.0, 1.0], "pos=b": [1.0, 1.0]}),
        compare(close, {"pos=a": [0.9], "pos=b": [0.8, 0.9]}),
        compare(lower, {"pos=a": [1.0, 1.1], "pos=b": [2.0, 2.1]}),
    ]
    assert [o.verdict for o in found] == ["ceiling", "inconclusive", "supports"]
    assert sum(len(c.kinds) for c in claim_family([close, close, lower])) == 5
    assert "; 5 hypotheses decided as one family by Holm's procedure" in staged_line(found, Design(0.05, 3, 9))
