"""tune: the tests of a real tuning sweep's process (the rest: tests/unit/test_tune.py).

Tuning sweeps (experiment=tune_lr): one seeded TPE study per grid cell, every trial a child of the
sweep's one parent run, each cell's best values in best.json (python -m results tune), and
optim.tuned running a cell at them with the rate logged as its param. The sweep is a real ``python run.py -m``
(Hydra finds the sweeper plugin as a user's command does); what reads it back, ``results tune`` and the
optim.tuned run, are their commands' entry functions in this interpreter (tests/inprocess.py).
"""

import json
import shutil

import pytest

from tests import inprocess
from tests.helpers import HANG, ROOT, TINY, run_sweep


@pytest.fixture(scope="module")
def tuning(tmp_path_factory, _empty_store):
    tmp = tmp_path_factory.mktemp("tune")
    shutil.copyfile(_empty_store, tmp / "mlflow.db")  # run_sweep records here: a migrated store, as `store` gives
    sweep = run_sweep(
        tmp,
        "experiment=tune_lr",
        "pos=none,rope",
        "hydra.sweeper.n_trials=3",
        "logger.experiment=posbench",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
    )
    out = tmp / "out"
    argv = ["tune", "--experiment", "posbench", "--out", str(out), "--tracking-uri", sweep.uri]
    report = inprocess.run("results", argv, str(ROOT), {}, HANG)  # python -m results tune …
    return sweep, report, out


def trials(sweep, pos: str) -> list:
    return [r for r in sweep.children if r.data.tags["pos"] == pos]


def test_each_cell_gets_its_own_seeded_study_of_children_of_one_parent(tuning):
    sweep, _, _ = tuning
    assert sweep.proc.returncode == 0, sweep.proc.stderr[-3000:]
    assert {r.data.tags["mlflow.parentRunId"] for r in sweep.children} == {sweep.parent.info.run_id}
    assert len(trials(sweep, "none")) == len(trials(sweep, "rope")) == 3 == len(sweep.children) / 2
    for r in sweep.children:
        assert 1e-4 <= float(r.data.params["optim.optimizer.lr"]) <= 3e-2  # the preset's log interval
        assert r.data.params["optim.schedule.warmup_steps"] == "2"  # TINY pins it: the command line wins
        assert r.data.tags["sweep_cell"].startswith("optim.optimizer.lr=")
    # every study starts from the configured sampler (seed 0): its first, random trials repeat across cells
    tried = {
        pos: [
            r.data.params["optim.optimizer.lr"]
            for r in sorted(trials(sweep, pos), key=lambda r: int(r.data.tags["sweep_job"]))
        ]
        for pos in ("none", "rope")
    }
    assert tried["none"] == tried["rope"] and len(set(tried["none"])) == 3


def test_best_json_holds_each_cells_lowest_final_loss(tuning):
    sweep, report, out = tuning
    assert report["code"] == 0, report["stderr"][-2000:]
    best = json.loads((out / "best.json").read_text())
    assert best["sweep_id"] == sweep.parent.data.tags["sweep_id"]
    for pos in ("none", "rope"):
        winner = min(trials(sweep, pos), key=lambda r: r.data.metrics["val/loss"])
        entry = best["cells"][f"pos={pos} attn=softmax"]
        assert (entry["run_id"], entry["val_loss"]) == (winner.info.run_id, winner.data.metrics["val/loss"])
        assert entry["values"] == {"optim.optimizer.lr": float(winner.data.params["optim.optimizer.lr"])}
    text = (out / "README.md").read_text()
    assert "| pos=rope attn=softmax | 3 (3) |" in text
    assert "Command: `python run.py -m " in text and " experiment=tune_lr pos=none,rope " in text


def test_optim_tuned_runs_a_cell_at_its_tuned_values_and_logs_them(tuning, store, tmp_path):
    _, _, out = tuning
    best = json.loads((out / "best.json").read_text())["cells"]["pos=rope attn=softmax"]["values"]
    argv = [*TINY, "pos=rope", f"optim.tuned={out / 'best.json'}", f"hydra.run.dir={tmp_path}/run"]
    done = inprocess.run("run", argv, str(ROOT), {"MLFLOW_TRACKING_URI": store}, HANG)  # python run.py …
    assert done["code"] == 0, done["stderr"][-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert float(run.data.params["optim.optimizer.lr"]) == best["optim.optimizer.lr"]
    assert run.data.params["optim.tuned"] == str(out / "best.json")
    lr = client.get_metric_history(run.info.run_id, "lr")  # the schedule peaks at the tuned rate
    assert max(m.value for m in lr) == pytest.approx(best["optim.optimizer.lr"], rel=1e-6)
