"""The comparison report: its numbers on synthetic cells and a synthetic store, and its CLI."""

import csv
import math

import pytest

from harness import integrity
from results.cells import Cell, build_report, default_target, mean_std, steps_to_target


def make_cell(pos, seed, val, status="finished", attn="softmax", job=0, **kw):
    return Cell(
        run_id=f"{pos}-{seed}",
        name=f"pos={pos} attn={attn} seed={seed}",
        label=f"pos={pos} seed={seed}",
        pos=pos,
        attn=attn,
        seed=str(seed),
        status=status,
        val=val,
        job=job,
        **kw,
    )


CELLS = [
    make_cell("rope", 0, [(10, 3.0), (20, 2.0)], tokens_per_s=100.0, n_params=1000, job=0),
    make_cell("rope", 1, [(10, 2.8), (20, 2.2)], tokens_per_s=300.0, n_params=1000, job=1),
    make_cell("learned", 0, [(10, 3.2), (20, 2.6)], tokens_per_s=200.0, n_params=1200, job=2),
    make_cell("learned", 1, [(10, 3.1)], status="diverged", reason="FloatingPointError: nan at step 12", job=3),
    make_cell("alibi", 0, [], status="incompatible", reason="ConfigError: incompatible pairing", job=4),
]


def test_mean_and_sample_std():
    stat = mean_std([1.0, 2.0, 4.0])
    assert stat.mean == pytest.approx(7 / 3)
    assert stat.std == pytest.approx(math.sqrt(7 / 3))  # ((16 + 1 + 25) / 9) / (3 - 1)
    assert mean_std([5.0]).std is None and mean_std([]).mean is None


def test_steps_to_target_is_the_first_step_at_or_below():
    val = [(10, 3.0), (20, 2.5), (30, 2.6), (40, 2.4)]
    assert steps_to_target(val, 2.55) == 20
    assert steps_to_target(val, 2.5) == 20
    assert steps_to_target(val, 2.0) is None


def test_groups_over_seeds():
    assert default_target(CELLS) == 2.6  # worst finished final loss; the diverged cell is ignored
    report = build_report(CELLS, "t", [])
    rope, learned, alibi = report.groups
    assert (rope.pos, rope.final.mean, rope.final.n) == ("rope", pytest.approx(2.1), 2)
    assert rope.final.std == pytest.approx(math.sqrt(0.02))  # finals 2.0, 2.2
    assert rope.best.mean == pytest.approx(2.1)
    assert rope.steps.mean == 20  # both seeds first at or below 2.6 at step 20
    assert rope.tokens_per_s.mean == 200.0 and rope.n_params == 1000
    assert (learned.final.mean, learned.final.n, learned.status) == (2.6, 1, "1 finished, 1 diverged")
    assert alibi.status == "incompatible" and alibi.final.mean is None
    explicit = build_report(CELLS, "t", [], target=2.9)
    assert explicit.groups[0].steps.mean == 15  # seed 0 reaches 2.9 at step 20, seed 1 at step 10


def write_synthetic_store(uri: str) -> str:
    """A parent + three children as the sweep writes them; returns the sweep id."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("synthetic")
    parent = client.create_run(
        exp, run_name="sweep pos=rope,learned seed=0,1", tags={"sweep_role": "parent", "sweep_id": "s1"}
    ).info.run_id
    cells = [
        ("rope", 0, [3.2, 2.0], None),
        ("rope", 1, [2.9, 2.4], None),
        ("learned", 0, [3.3, 3.1], None),
        ("learned", 1, [], "incompatible"),
    ]
    for job, (pos, seed, losses, failure) in enumerate(cells):
        tags = {
            "pos": pos,
            "attn": "softmax",
            "seed": str(seed),
            "mlflow.parentRunId": parent,
            "sweep_id": "s1",
            "sweep_cell": f"pos={pos} seed={seed}",
            "sweep_job": str(job),
        }
        if failure:
            tags |= {"failure": failure, "failure_reason": "ConfigError: refused"}
        name = f"pos={pos} attn=softmax seed={seed}"
        run = client.create_run(exp, run_name=name, start_time=1_000 + job, tags=tags).info.run_id  # launch order
        client.log_param(run, "model.n_params", "1234")
        metrics = [Metric("val/loss", v, 0, 10 * (i + 1)) for i, v in enumerate(losses)]
        metrics += [Metric("train/tokens_per_s", v, 0, s) for s, v in ((5, 90.0), (10, 110.0))] if losses else []
        if metrics:
            client.log_batch(run, metrics=metrics)
        client.set_terminated(run, status="FAILED" if failure else "FINISHED")
    client.set_terminated(parent)
    return "s1"


def test_a_run_a_later_sweep_adopted_stays_in_the_earlier_sweeps_report(store):
    """A re-run sweep adopts a finished cell (harness/sweep/cell.py): the run moves under the new parent, and the
    earlier sweep's Regenerate command still rebuilds the report that sweep attached, the run listed in both."""
    from mlflow.tracking import MlflowClient

    from harness.record.store import Store
    from harness.sweep.cell import adopt
    from results.store import cells_of, find_sweep

    uri = store  # a copy of the migrated empty store
    write_synthetic_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("synthetic").experiment_id
    again = client.create_run(exp, tags={"sweep_role": "parent", "sweep_id": "s2"}).info.run_id
    for run in client.search_runs([exp], "tags.pos = 'rope'"):
        adopt(Store.open(uri), run, {"mlflow.parentRunId": again, "sweep_id": "s2", "sweep_cell": "pos=rope"})
    assert [c.label for c in cells_of(client, find_sweep(client, "synthetic", "s1"))] == [
        "pos=rope",
        "pos=rope",
        "pos=learned seed=0",
        "pos=learned seed=1",
    ]
    assert [c.pos for c in cells_of(client, find_sweep(client, "synthetic", "s2"))] == ["rope", "rope"]


def test_a_sweeps_cells_are_read_in_launch_order(store):
    """MLflow lists runs newest first; the cells are read back in the order they ran, so a claim's per-seed figures
    name seed 0 first, as the tables under them do."""
    from mlflow.tracking import MlflowClient

    from results.paper import arm_values, compare
    from results.store import cells_of, find_sweep

    uri = store  # a copy of the migrated empty store
    write_synthetic_store(uri)
    client = MlflowClient(tracking_uri=uri)
    cells = cells_of(client, find_sweep(client, "synthetic", None))
    assert [(c.pos, c.seed) for c in cells] == [("rope", "0"), ("rope", "1"), ("learned", "0"), ("learned", "1")]
    below = {"metric": "val/loss", "below": 3.0, "cell": "pos=rope"}
    assert compare(below, arm_values(client, cells, below)).text.endswith("per seed 2, 2.4")  # finals of seeds 0, 1


def test_a_report_says_how_many_of_its_runs_were_read_without_a_seal(store):
    """Runs closed before posbench sealed run records are read as they are; the report's header counts them, so a
    reader knows which figures no seal vouches for. Sealed, the note goes."""
    from mlflow.tracking import MlflowClient

    from harness.integrity import seal
    from results.store import find_sweep, sweep_report

    uri = store  # a copy of the migrated empty store
    write_synthetic_store(uri)
    client = MlflowClient(tracking_uri=uri)
    sweep = find_sweep(client, "synthetic", None)
    assert "5 runs" not in sweep_report(client, sweep).header[0]  # 4 cells and the parent, none sealed
    assert (
        "4 runs (5 closed before posbench sealed run records: their values are read unchecked)"
        in sweep_report(client, sweep).header[0]
    )
    for run in [*sweep.runs[:2], sweep.parent]:
        seal(client, run.info.run_id)
    sweep = find_sweep(client, "synthetic", None)
    assert "(2 closed before posbench sealed run records" in sweep_report(client, sweep).header[0]
    for run in sweep.runs:
        seal(client, run.info.run_id)
    assert "4 runs, git" in sweep_report(client, find_sweep(client, "synthetic", None)).header[0]


def test_the_regenerate_line_repeats_the_settings_the_report_was_made_with(store):
    """A target, an order-gain threshold or a baseline given to the report is not on the sweep's record (a sweep
    records report.baseline, report.alpha and report.margin only), so its Regenerate line carries it: run as shown,
    the command makes the same report."""
    from mlflow.tracking import MlflowClient

    from results.store import find_sweep, sweep_report

    uri = store  # a copy of the migrated empty store
    write_synthetic_store(uri)
    client = MlflowClient(tracking_uri=uri)
    sweep = find_sweep(client, "synthetic", None)
    command = "Regenerate: `python -m results report --experiment synthetic --sweep s1"
    made = sweep_report(client, sweep, 2.5, min_order_gain=0.1, baseline="learned")
    assert made.header[2] == (
        f"{command} --target 2.5 --min-order-gain 0.1 --baseline learned --out results/synthetic/`"
    )
    assert sweep_report(client, sweep).header[2] == f"{command} --out results/synthetic/`"


def test_cli_report_from_a_synthetic_store(tmp_path, store, capsys):
    from results.__main__ import main

    uri = store  # a copy of the migrated empty store
    write_synthetic_store(uri)
    out = tmp_path / "out"
    assert main(["report", "--experiment", "synthetic", "--out", str(out), "--tracking-uri", uri]) == 0
    assert {p.name for p in out.iterdir()} == {
        "report.md",
        "report.csv",
        "val_loss_curves.png",
        "final_val_loss_heatmap.png",
        "SHA256SUMS",
    }
    assert integrity.check_report(out, "") and len((out / "SHA256SUMS").read_text().splitlines()) == 4  # every file
    rows = {r["pos"]: r for r in csv.DictReader((out / "report.csv").open())}
    rope = rows["rope"]
    assert float(rope["final_val_loss_mean"]) == pytest.approx(2.2)
    assert float(rope["final_val_loss_std"]) == pytest.approx(math.sqrt(0.08))  # finals 2.0, 2.4
    assert float(rope["target_loss"]) == pytest.approx(3.1)  # learned seed 0 is the worst finished cell
    assert float(rope["steps_to_target_mean"]) == 15  # ≤ 3.1 first at step 20 (seed 0) and 10 (seed 1)
    assert float(rope["steps_to_target_std"]) == pytest.approx(math.sqrt(50))
    # two windows of 5 steps each, at 90 and 110 tokens/s: 2 windows' tokens ÷ their seconds, 2 / (1/90 + 1/110)
    assert float(rope["tokens_per_s_mean"]) == pytest.approx(99.0) and rope["n_params"] == "1234"
    assert rows["learned"]["status"] == "1 finished, 1 incompatible"
    md = (out / "report.md").read_text()
    assert "sweep pos=rope,learned seed=0,1 (s1)" in md and "| rope | softmax | 0,1 | finished |" in md

    assert (
        main(["report", "--experiment", "synthetic", "--sweep", "nope", "--out", str(out), "--tracking-uri", uri]) == 2
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (MLflow logs its own lines above)
    assert last.startswith("error: no sweep 'nope' in experiment 'synthetic'; omit --sweep")


def test_headline_metrics_count_cells_and_take_finished_losses():
    from results.cells import Cell
    from results.report import headline_metrics

    def cell(status, losses):
        return Cell("id", "name", "label", "rope", "softmax", "0", status, val=list(enumerate(losses)))

    cells = [
        cell("finished", [3.0, 2.5]),
        cell("finished", [3.0, 2.75]),
        cell("incompatible", []),
        cell("diverged", [3.0, 1.0]),
        cell("error", []),
    ]  # a diverged cell's last loss is not a result
    assert headline_metrics(cells) == {
        "sweep/best_val_loss": 2.5,
        "sweep/worst_val_loss": 2.75,
        "sweep/cells_finished": 2,
        "sweep/cells_refused": 1,
        "sweep/cells_failed": 2,
    }
    assert headline_metrics([cell("incompatible", [])]) == {
        "sweep/cells_finished": 0,
        "sweep/cells_refused": 1,
        "sweep/cells_failed": 0,
    }


def test_every_evaluation_condition_gets_a_row_of_its_own():
    """Scalings, fine-tunes, sliding windows and same-targets are tabled apart, mean ± std over seeds."""
    from results.report import markdown

    runs = [
        {
            "val/loss_at_64": 2.0 + s,
            "val/loss_at_128": 2.1 + s,
            "val/yarn/loss_at_128": 2.5 + s,
            "val/finetuned/yarn/loss_at_128": 2.2 + s,
            "val/loss_at_128_stride_16": 2.05 + s,
            "val/loss_at_128_last_32": 1.9 + s,
            "val/order_gain": 1.0,
        }
        for s in (0.0, 0.2)
    ]
    cells = [make_cell("rope", i, [(10, 2.0)], metrics=m, job=i) for i, m in enumerate(runs)]
    group = build_report(cells, "t", []).groups[0]
    assert set(group.conditions) == {"windows", "yarn", "yarn, fine-tuned", "sliding, stride 16", "last 32 tokens"}
    assert group.conditions["yarn"][128].mean == pytest.approx(2.6)
    assert group.conditions["yarn"][128].std == pytest.approx(0.2 / math.sqrt(2))
    assert 64 not in group.conditions["yarn"] and group.conditions["windows"][64].mean == pytest.approx(2.1)
    text = markdown(build_report(cells, "t", []), [])
    assert "| rope | softmax | yarn, fine-tuned | — | 2.3000 ± 0.1414 |" in text
    plain = [make_cell("rope", 0, [(10, 2.0)], metrics={"val/loss_at_64": 2.0})]
    assert "under each evaluation" not in markdown(build_report(plain, "t", []), [])  # windows only: no extra table


def test_task_accuracies_by_length_sit_beside_each_tasks_position_blind_baseline():
    """Per token (mean ± std) with exact match in parentheses, per task × scheme; one position-blind row per task."""
    from results.report import markdown

    def metrics(token, exact, blind):
        return {
            "val/token_acc_at_8": token,
            "val/acc_at_8": exact,
            "val/token_acc_at_16": token / 2,
            "val/acc_at_16": 0.0,
            "val/blind_token_acc_at_8": blind,
            "val/blind_acc_at_8": 0.01,
            "val/blind_token_acc_at_16": blind - 0.1,
            "val/blind_acc_at_16": 0.0,
        }

    cells = [
        make_cell(pos, s, [(10, 1.0)], variant="task=reverse", metrics=metrics(t, e, 0.64), job=j)
        for j, (pos, s, t, e) in enumerate(
            [("rope", 0, 0.9, 0.5), ("rope", 1, 0.8, 0.3), ("alibi", 0, 0.7, 0.1), ("alibi", 1, 0.7, 0.1)]
        )
    ]
    text = markdown(build_report(cells, "t", []), [])
    assert "## Accuracy vs evaluation length (synthetic tasks)" in text
    assert "| rope task=reverse | softmax | 0.850 ± 0.071 (0.400 ± 0.141) | 0.425 ± 0.035 (0.000 ± 0.000) |" in text
    assert text.count("| position-blind task=reverse | — | 0.640 (0.010) | 0.540 (0.000) |") == 1  # once per task
    # arms of one task (a preset's +experiment/…/arm=…): the blind baseline is the task's, shown once; an arm whose
    # own differs (another task picked by the arm) is named
    arms = [
        make_cell("rope", 0, [(10, 1.0)], variant=f"+experiment/x/arm={arm}", metrics=metrics(0.9, 0.5, blind), job=j)
        for j, (arm, blind) in enumerate([("ordered", 0.64), ("randomized", 0.64), ("other", 0.5)])
    ]
    text = markdown(build_report(arms, "t", []), [])
    assert text.count("| position-blind") == 2 and "| position-blind +experiment/x/arm=other | — | 0.500" in text
    assert "| position-blind +experiment/x/arm=ordered | — | 0.640 (0.010) |" in text  # each named: they differ
    arms.pop()
    text = markdown(build_report(arms, "t", []), [])
    assert text.count("| position-blind | — | 0.640 (0.010) | 0.540 (0.000) |") == 1  # the task's, once
    assert "Accuracy vs evaluation length" not in markdown(build_report(CELLS, "t", []), [])  # no task: no table


def test_a_mixtures_parts_get_rows_of_their_own_under_the_pooled_one():
    """task=mixture logs val/<part>/token_acc_at_<L> per part: each part has its own row per scheme and its own
    position-blind row, once."""
    from results.report import markdown

    def metrics(reverse):
        return {
            "val/token_acc_at_8": 0.8,
            "val/acc_at_8": 0.2,
            "val/reverse/token_acc_at_8": reverse,
            "val/reverse/acc_at_8": 0.1,
            "val/sort/token_acc_at_8": 0.95,
            "val/sort/acc_at_8": 0.6,
            "val/reverse/blind_token_acc_at_8": 0.6,
            "val/reverse/blind_acc_at_8": 0.01,
            "val/reverse/token_acc": 0.99,
            "val/reverse/loss_at_8": 0.5,
        }

    cells = [
        make_cell(pos, s, [(10, 1.0)], variant="task=mixture", metrics=metrics(r), job=j)
        for j, (pos, s, r) in enumerate([("rope", 0, 0.7), ("rope", 1, 0.9), ("alibi", 0, 0.5)])
    ]
    text = markdown(build_report(cells, "t", []), [])
    assert "| rope task=mixture | softmax | 0.800 ± 0.000 (0.200 ± 0.000) |" in text
    assert "| rope task=mixture · reverse | softmax | 0.800 ± 0.141 (0.100 ± 0.000) |" in text
    assert "| alibi task=mixture · sort | softmax | 0.950 (0.600) |" in text
    assert text.count("| position-blind task=mixture reverse | — | 0.600 (0.010) |") == 1
    # a part's loss by length is the part's, not a RoPE scaling's
    assert "| rope task=mixture | softmax | reverse (mixture part) | 0.5000 ± 0.0000 |" in text


def test_a_report_that_fails_midway_leaves_the_folder_as_it_was(tmp_path):
    """Every command that writes a report folder writes it through ``integrity.report_folder``: a full disk mid-PNG
    (here an ENOSPC raised after some files were written) leaves the committed report byte for byte as it was and no
    staging folder behind; a folder that did not exist is not made; on success the written files replace theirs and
    SHA256SUMS lists exactly them (a stale file beside them stays, unsealed)."""
    import errno

    from harness.integrity import SUMS, check_report, report_folder

    out = tmp_path / "results" / "demo"
    out.mkdir(parents=True)
    (out / "README.md").write_text("the committed report")
    (out / "plot.png").write_bytes(b"\x89PNG old")
    with pytest.raises(OSError), report_folder(out) as staging:
        (staging / "README.md").write_text("half a new rep")
        (staging / "new.csv").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (out / "README.md").read_text() == "the committed report" and not (out / "new.csv").exists()
    assert (out / "plot.png").read_bytes() == b"\x89PNG old"
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["demo"]  # no staging folder left
    fresh = tmp_path / "results" / "fresh"
    with pytest.raises(KeyboardInterrupt), report_folder(fresh) as staging:
        (staging / "README.md").write_text("partial")
        raise KeyboardInterrupt
    assert not fresh.exists()
    with report_folder(out) as staging:  # success: the new files stay, sealed; the stale plot is not sealed
        (staging / "README.md").write_text("the new report")
    assert (out / "README.md").read_text() == "the new report" and (out / "plot.png").exists()
    assert [line.split()[1] for line in (out / SUMS).read_text().splitlines()] == ["README.md"]
    assert check_report(out, "fix") and sorted(p.name for p in (tmp_path / "results").iterdir()) == ["demo"]
