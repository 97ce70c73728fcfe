"""Sweeps end to end: parent and child runs, failure capture, exit codes, length extrapolation."""

import contextlib
import json
import math
import shutil

import pytest

from tests.helpers import TINY, compose, run_sweep

REPORT_FILES = {"report.md", "report.csv", "val_loss_curves.png", "final_val_loss_heatmap.png", "SHA256SUMS"}


def test_sweep_is_one_parent_with_a_child_per_cell(tiny_sweep):
    s = tiny_sweep
    assert s.proc.returncode == 0, s.proc.stderr[-3000:]
    assert s.parent is not None
    assert s.parent.info.run_name == "sweep pos=rope,learned"
    assert s.parent.info.status == "FINISHED"
    sweep_id = s.parent.data.tags["sweep_id"]
    assert s.parent.data.tags["report_min_order_gain"] == "0.05"  # what a rebuilt report judges at (results/store.py)
    assert json.loads((s.sweep_dir / "mlflow_sweep.json").read_text())["parent_run_id"] == s.parent.info.run_id

    assert sorted(r.data.tags["pos"] for r in s.children) == ["learned", "rope"]
    for run in s.children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == s.parent.info.run_id
        assert run.data.tags["sweep_id"] == sweep_id
        assert run.data.tags["sweep_cell"] == f"pos={run.data.tags['pos']}"
        assert run.info.run_name == f"pos={run.data.tags['pos']} attn=softmax seed=0"
        assert "failure" not in run.data.tags

    artifacts = {a.path for a in s.client.list_artifacts(s.parent.info.run_id)}
    assert REPORT_FILES | {"val_loss_vs_length.png"} <= artifacts
    assert "| rope | softmax | 0 | finished |" in s.parent.data.tags["mlflow.note.content"]
    # the summary table at the end: one line per cell with its status
    assert any(line.startswith("pos=rope ") and "finished" in line for line in s.proc.stdout.splitlines())
    # ... then the verdict: no pos=none here and no report.baseline declared, so no scheme is made the other's
    # baseline after the fact (a sweep that declares one: tests/process/test_install.py's, report.baseline=rope)
    assert (
        "\nNo verdict for attn=softmax: no baseline was declared and there is no pos=none to compare with; run "
        "the sweep with report.baseline=<pos>, one of learned, rope, named before the results"
    ) in s.proc.stdout
    assert not any(" vs " in line for line in s.proc.stdout.splitlines())


def test_parent_row_has_headline_metrics_and_the_summary_links_this_sweep(tiny_sweep):
    s, parent = tiny_sweep, tiny_sweep.parent
    finals = sorted(r.data.metrics["val/loss"] for r in s.children)
    assert parent.data.metrics["sweep/best_val_loss"] == pytest.approx(finals[0], rel=1e-12)
    assert parent.data.metrics["sweep/worst_val_loss"] == pytest.approx(finals[-1], rel=1e-12)
    counts = {k: parent.data.metrics[f"sweep/cells_{k}"] for k in ("finished", "refused", "failed")}
    assert counts == {"finished": 2, "refused": 0, "failed": 0}
    exp, sweep_id = parent.info.experiment_id, parent.data.tags["sweep_id"]
    base = f"http://127.0.0.1:5000/#/experiments/{exp}/runs"
    assert f"mlflow ui --backend-store-uri {s.uri} --host 127.0.0.1 --port 5000" in s.proc.stdout
    assert (
        f"{base}?searchFilter=tags.sweep_id%20%3D%20%27{sweep_id}%27&orderByKey=attributes.run_name"
        "&orderByAsc=true&workflowType=machine_learning"
    ) in s.proc.stdout
    assert f"{base}/{parent.info.run_id}?workflowType=machine_learning" in s.proc.stdout


def test_eval_lengths_log_loss_at_length_and_skip_beyond_learned_table(tiny_sweep):
    rope, learned = tiny_sweep.child("rope"), tiny_sweep.child("learned")
    for n in (16, 64):
        assert math.isfinite(rope.data.metrics[f"val/loss_at_{n}"])
        loss = rope.data.metrics[f"val/loss_at_{n}"]
        assert rope.data.metrics[f"val/bpc_at_{n}"] == pytest.approx(loss / math.log(2))
    assert [m.step for m in tiny_sweep.client.get_metric_history(rope.info.run_id, "val/loss_at_64")] == [6]
    assert "val/loss_at_16" in learned.data.metrics
    assert "val/loss_at_64" not in learned.data.metrics
    assert "has 32 positions but the input needs 64" in learned.data.tags["eval_skipped_at_64"]
    assert "eval_skipped_at_64" not in rope.data.tags


def test_failed_cells_are_recorded_and_the_others_finish(store, tmp_path):
    # lr=1e6 reliably gives a NaN loss at step 2 with TINY (checked); a bad value (lr=-1) never gets this far:
    # the sweep is checked whole before it launches (tests/unit/test_bad_input.py, sweep-* rows)
    # a real process (its exit status); run_sweep records into tmp_path/mlflow.db, the `store` fixture's migrated copy
    s = run_sweep(tmp_path, "optim.optimizer.lr=1e6,1e-3")
    assert s.proc.returncode == 1, s.proc.stderr[-3000:]
    assert s.parent.info.status == "FAILED"
    by_lr = {r.data.params["optim.optimizer.lr"]: r for r in s.children}
    assert set(by_lr) == {"1000000.0", "0.001"}
    assert all(r.info.status != "RUNNING" for r in s.children)
    assert all(r.data.tags["mlflow.parentRunId"] == s.parent.info.run_id for r in s.children)

    diverged, finished = by_lr["1000000.0"], by_lr["0.001"]
    assert (diverged.info.status, diverged.data.tags["failure"]) == ("FAILED", "diverged")
    assert "loss is nan at step 2" in diverged.data.tags["failure_reason"]
    assert diverged.data.tags["pos"] == "rope" and diverged.data.tags["sweep_cell"] == "optim.optimizer.lr=1000000.0"
    assert finished.info.status == "FINISHED" and "failure" not in finished.data.tags
    out = s.proc.stdout
    assert "diverged" in out and "exit 1" in out
    counts = {k: s.parent.data.metrics[f"sweep/cells_{k}"] for k in ("finished", "refused", "failed")}
    assert counts == {"finished": 1, "refused": 0, "failed": 1}  # refused counts incompatible pairings
    assert s.parent.data.metrics["sweep/best_val_loss"] == finished.data.metrics["val/loss"]
    assert REPORT_FILES <= {a.path for a in s.client.list_artifacts(s.parent.info.run_id)}


def test_exit_code_rules():
    from harness.sweep.callback import exit_code

    assert exit_code(["finished", "finished"]) == 0
    assert exit_code(["finished", "incompatible"]) == 0
    assert exit_code(["finished", "diverged"]) == 1
    assert exit_code(["finished", "error", "incompatible"]) == 1
    assert exit_code(["incompatible", "incompatible"]) == 2  # nothing trained


def test_sweep_name_shows_only_swept_overrides():
    from harness.sweep.callback import sweep_name

    assert sweep_name(["pos=rope,t5", "attn=performer", "seed=0,1,2", "model.n_layers=2"]) == (
        "sweep pos=rope,t5 seed=0,1,2",
        ["pos", "seed"],
    )


def multirun_config(sweep_dir):
    """The config on_multirun_start receives for `run.py -m pos=rope,learned`."""
    from omegaconf import open_dict

    cfg = compose([f"hydra.sweep.dir={sweep_dir}"])
    with open_dict(cfg):
        cfg.hydra.overrides.task = ["pos=rope,learned"]
    return cfg


@contextlib.contextmanager
def started_sweep(overrides: list[str], sweep_dir):
    """The real callback started in-process for `run.py -m <overrides>` (overrides with no sweep of their own: the
    preset's axes are the sweep); its parent is closed afterwards."""
    from omegaconf import open_dict

    from harness.sweep.callback import MlflowSweep

    cfg = compose([*overrides, f"hydra.sweep.dir={sweep_dir}"])
    with open_dict(cfg):
        cfg.hydra.overrides.task = overrides
    callback = MlflowSweep()
    callback.on_multirun_start(cfg)
    try:
        yield callback
    finally:
        callback._abort()


@pytest.fixture(scope="module")
def module_store(tmp_path_factory, _empty_store):
    """One store for the in-process sweep tests, a copy of the migrated empty one: migrating costs seconds."""
    tmp = tmp_path_factory.mktemp("store")
    shutil.copyfile(_empty_store, tmp / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
        yield f"sqlite:///{tmp / 'mlflow.db'}", tmp


@pytest.fixture
def sweep_callback(module_store, tmp_path):
    """The real callback's on_multirun_start, in-process; its parent is closed afterwards."""
    from harness.sweep.callback import MlflowSweep

    callback = MlflowSweep()
    callback.on_multirun_start(multirun_config(tmp_path))
    yield callback
    callback._abort()


@pytest.fixture
def cell(module_store, sweep_callback):
    """Run one sweep cell in-process under the callback's parent; its child runs."""
    from mlflow.tracking import MlflowClient

    from harness.config.load import load
    from harness.sweep.cell import train_cell

    def run(*overrides):
        spec = load([*TINY, *overrides], multirun=True)
        returned = train_cell(spec, sweep_callback.record.child_tags(list(overrides), 0))
        client = MlflowClient(tracking_uri=module_store[0])
        runs = client.search_runs(
            [client.get_experiment_by_name("posbench").experiment_id],
            f"tags.`mlflow.parentRunId` = '{sweep_callback.record.parent_run_id}'",
        )
        return returned, runs, sweep_callback

    return run


def test_incompatible_pairing_is_a_failed_child_run(cell, monkeypatch):
    from attention.softmax import Softmax

    # The pairing check is the real one; only this variant's answer is forced, as a new
    # attention variant refusing a scheme would give it.
    monkeypatch.setattr(Softmax, "refusal", classmethod(lambda cls, scheme: "cannot honour this scheme (test)"))
    returned, runs, callback = cell("pos=learned")
    assert returned is None
    [run] = runs
    assert run.info.status == "FAILED"
    assert run.data.tags["failure"] == "incompatible"
    assert (
        run.data.tags["failure_reason"] == "IncompatiblePairing: incompatible pairing: cannot honour this scheme (test)"
    )
    assert run.data.tags["mlflow.parentRunId"] == callback.record.parent_run_id
    assert run.data.tags["pos"] == "learned" and run.info.run_name == "pos=learned attn=softmax seed=0"


def test_a_crash_is_recorded_and_does_not_raise(cell, monkeypatch):
    from harness.model.module import LanguageModel

    def crash(self, batch, batch_idx):
        raise RuntimeError("boom in training_step")

    monkeypatch.setattr(LanguageModel, "training_step", crash)
    returned, [run], _ = cell("pos=rope")
    assert returned is None
    assert run.info.status == "FAILED"
    assert run.data.tags["failure"] == "error"
    assert run.data.tags["failure_reason"] == "RuntimeError: boom in training_step"


def test_an_aborted_sweep_leaves_no_parent_running(module_store, sweep_callback):
    from mlflow.tracking import MlflowClient

    parent = sweep_callback.record.parent_run_id
    client = MlflowClient(tracking_uri=module_store[0])
    assert client.get_run(parent).info.status == "RUNNING"
    sweep_callback._abort()  # what atexit (or SIGTERM, turned into SystemExit) runs
    run = client.get_run(parent)
    assert run.info.status == "FAILED" and run.data.tags["failure"] == "aborted"


def test_a_staged_presets_parent_is_named_without_the_seed_axis_its_looks_replace(module_store, tmp_path):
    """experiment=ablation sweeps seed=0,1,2; under report.seeds=auto the sweeper trains the seeds, and the parent's
    name and recorded axes say so."""
    from mlflow.tracking import MlflowClient

    with started_sweep(["experiment=ablation", "report.seeds=auto"], tmp_path) as callback:
        run = MlflowClient(tracking_uri=module_store[0]).get_run(callback.record.parent_run_id)
        assert run.info.run_name == "sweep pos=none,learned,rope" and callback.record.swept_keys == ["pos", "seed"]
        assert run.data.tags["report_stages"] == "3,10,obrien-fleming"


def test_a_presets_axis_pinned_with_a_prefix_is_not_in_the_parents_name(module_store, tmp_path):
    """``-m experiment=ablation ++seed=5`` pins the preset's seed axis as ``seed=5`` does (harness/config/load.py
    preset_axes): the parent is named and its cells tagged by pos alone, as the sweeper runs them."""
    with started_sweep(["experiment=ablation", "++seed=5"], tmp_path) as callback:
        assert callback.record.swept_keys == ["pos"]


def test_a_sweep_cell_trains_from_the_weights_a_single_run_of_it_draws(store, _empty_store, tmp_path):
    """The preflight checks every cell on meta first; a cell launched in this process (the basic launcher) then
    constructs its model once, directly, after its seed: its first validation loss is that of a single run of the
    same overrides, and cells of one model config (seeds) each draw their own weights."""
    from mlflow.tracking import MlflowClient

    from harness.train import train
    from tests.helpers import spec
    from tests.inprocess import run

    uri = store  # tmp_path/mlflow.db, a migrated empty store
    done = run(
        "run",
        ["-m", *TINY, "trainer.max_steps=2", "pos=rope,t5", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        str(tmp_path),
        {"MLFLOW_TRACKING_URI": uri},
    )
    assert done["code"] == 0, done["stderr"][-2000:]

    def first_val_loss(client, run_id: str) -> float:
        return min(client.get_metric_history(run_id, "val/loss"), key=lambda m: (m.step, m.timestamp)).value

    client = MlflowClient(tracking_uri=uri)
    cells = {
        (r.data.tags["pos"], r.data.params["seed"]): first_val_loss(client, r.info.run_id)
        for r in client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
        if r.data.tags.get("sweep_role") != "parent"
    }
    assert sorted(cells) == [("rope", "0"), ("rope", "1"), ("t5", "0"), ("t5", "1")]
    assert cells["rope", "0"] != cells["rope", "1"] and cells["t5", "0"] != cells["t5", "1"]
    shutil.copyfile(_empty_store, tmp_path / "alone.db")
    alone = f"sqlite:///{tmp_path / 'alone.db'}"
    for pos, seed in [("rope", "1"), ("t5", "0")]:
        summary = train(spec("trainer.max_steps=2", f"pos={pos}", f"seed={seed}", f"logger.tracking_uri={alone}"))
        assert first_val_loss(MlflowClient(tracking_uri=alone), summary.run_id) == cells[pos, seed]


def test_a_finished_cell_whose_record_was_damaged_is_trained_again_with_a_warning(store, tmp_path):
    """A re-run sweep adopts a cell that already FINISHED; one whose record changed in the store since it closed (its
    seal, harness/integrity.py) is not adopted: one warning line names it, and the cell trains again."""
    import sqlite3

    from tests.inprocess import run

    uri = store  # tmp_path/mlflow.db, a migrated empty store
    sweep = ["-m", *TINY, "trainer.max_steps=2", "pos=rope", "seed=0,1"]
    first = run("run", [*sweep, f"hydra.sweep.dir={tmp_path / 'a'}"], str(tmp_path), {"MLFLOW_TRACKING_URI": uri})
    assert first["code"] == 0, first["stderr"][-2000:]
    with sqlite3.connect(tmp_path / "mlflow.db") as conn:  # seed 1's record edited after it closed
        [(damaged,)] = conn.execute("SELECT run_uuid FROM runs WHERE name = 'pos=rope attn=softmax seed=1'")
        conn.execute("UPDATE params SET value = '33' WHERE key = 'data.seq_len' AND run_uuid = ?", (damaged,))
    again = run("run", [*sweep, f"hydra.sweep.dir={tmp_path / 'b'}"], str(tmp_path), {"MLFLOW_TRACKING_URI": uri})
    assert again["code"] == 0, again["stderr"][-2000:]
    warned = [line for line in again["stderr"].splitlines() if line.startswith("warning: run ")]
    assert len(warned) == 1 and damaged in warned[0] and warned[0].endswith("; this cell trains again")
    assert "skipped: seed=0" in again["stdout"] and "skipped: seed=1" not in again["stdout"]


def test_a_finished_cell_adopted_on_every_slurm_task_keeps_its_previous_parent(store, monkeypatch):
    """Under SLURM each task of a re-run sweep's job finds the FINISHED run of its cell; global rank 0 alone adopts
    it, so a later task does not read this sweep's parent back as the run's previous one."""
    from lightning.pytorch.utilities import rank_zero_only
    from mlflow.tracking import MlflowClient

    from harness.config.load import load
    from harness.record.resume import config_hash
    from harness.sweep.cell import skip_finished

    spec = load([*TINY, "pos=rope"], multirun=True)
    client = MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("posbench")
    old, new = (client.create_run(experiment).info.run_id for _ in range(2))
    tags = {"config_hash": config_hash(spec.values, store), "mlflow.parentRunId": old}
    run = client.create_run(experiment, tags=tags).info.run_id
    client.set_terminated(run, "FINISHED")
    for rank in (0, 1):  # SLURM_PROCID 0, then 1
        monkeypatch.setattr(rank_zero_only, "rank", rank)
        skip_finished(spec, {"mlflow.parentRunId": new, "sweep_id": "again"})
    adopted = client.get_run(run).data.tags
    assert (adopted["mlflow.parentRunId"], adopted["adopted_from_parent"]) == (new, old)


def test_seeds_in_stages_are_recorded_look_by_look_and_replayed_by_the_report(store, tmp_path):
    """report.seeds=auto: the sweeper trains 2 seeds per arm, then more only while the comparison is undecided;
    the parent run records the design and each look, and the report, reading the runs back, decides as it did."""
    from results.store import find_sweep, sweep_report
    from results.verdicts import verdicts

    s = run_sweep(
        tmp_path, "pos=none,rope", "report.seeds=auto", "report.stage=2", "report.max_seeds=4", in_process=True
    )
    assert s.proc.returncode == 0, s.proc.stderr[-3000:]
    tags = s.parent.data.tags
    assert tags["report_stages"] == "2,4,obrien-fleming" and "seed=" not in tags["sweep_overrides"]
    seeds = {
        pos: sorted(int(r.data.tags["seed"]) for r in s.children if r.data.tags["pos"] == pos)
        for pos in ("none", "rope")
    }
    assert seeds["none"] == seeds["rope"] in ([0, 1], [0, 1, 2, 3])
    [look] = [k for k in (1, 2) if "pos=rope vs pos=none: " in tags.get(f"look_{k}", "")]
    assert tags["look_1"].startswith("2 seeds per arm: ") and look == len(seeds["rope"]) // 2
    trained = s.client.get_metric_history(s.parent.info.run_id, "stages/trained")
    assert trained[-1].value == len(s.children) and [m.step for m in trained] == list(range(1, look + 1))
    sweep = find_sweep(s.client, "posbench", tags["sweep_id"])
    report = sweep_report(s.client, sweep)
    [v] = verdicts(report.groups, report.min_order_gain, staged=report.staged)  # as the sweeper judged
    if v.verdict == "premature":  # rope not yet using word order at the first look's seeds: it ended there
        assert look == 1 and seeds["rope"] == [0, 1] and "pos=rope vs pos=none: premature" in tags["look_1"]
    else:
        assert f"look {look} of 2" in v.text and f"n = {len(seeds['rope'])} vs {len(seeds['none'])}" in v.text
        assert f"pos=rope vs pos=none: {v.verdict}" in tags[f"look_{look}"]
    # where each arm's spread comes from: every run recorded its validation windows, the same ones
    from results.report import markdown
    from results.spread import split, table

    text = markdown(report, [])
    assert "## Where the spread comes from" in text
    for g in report.groups:
        x = table([c.windows for c in g.cells])
        assert x is not None and x.shape == (len(seeds[g.pos]), x.shape[1]) and x.shape[1] > 1
        finals = sorted(c.final_loss for c in g.cells)
        assert sorted(x.mean(axis=1)) == pytest.approx(finals, rel=1e-6)  # the metric is logged in float32
        part = split(x)
        assert f"| {g.pos} | softmax | {part.runs} × {part.windows} | {part.spread:.4f} | {part.seeds:.4f} |" in text
