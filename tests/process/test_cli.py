"""run.py as a user runs it: a subprocess, a temporary store, read back with MlflowClient."""

import json
import os
import platform
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests import inprocess
from tests.helpers import HANG, ROOT, TINY, gemma3


def run_py(args, store, tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            *args,
            f"hydra.run.dir={tmp_path}/run",
            f"hydra.sweep.dir={tmp_path}/multirun",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=HANG,
    )


def runs_in(store):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("posbench")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def test_run_py_prints_summary_and_dashboard_command(store, tmp_path):
    out = run_py(TINY, store, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    [run] = runs_in(store)
    assert run.info.status == "FINISHED"
    kept = platform.libc_ver()[0] == "glibc" and os.environ.get("POSBENCH_MALLOC", "").strip().lower() != "system"
    assert run.data.tags["malloc"].startswith("glibc malloc, mmap off" if kept else "system malloc")  # run.py's
    run_url = (
        f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        "?workflowType=machine_learning"
    )  # MLflow 3's Model training view, not its GenAI one
    for needle in (
        "final val loss",
        "val bits/byte",
        "train tokens/s",
        run.info.run_id,
        f"mlflow ui --backend-store-uri {store} --host 127.0.0.1",
        f"this run         {run_url}",
    ):
        assert needle in out.stdout


def test_multirun_logs_one_run_per_cell_in_one_experiment(tiny_sweep):
    """python run.py -m pos=rope,learned (conftest's one shared sweep: its cells train once per session)."""
    out = tiny_sweep.proc
    assert out.returncode == 0, out.stderr[-2000:]
    runs = runs_in(tiny_sweep.uri)
    [parent] = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.tags["pos"] for r in children) == ["learned", "rope"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert {r.info.status for r in runs} == {"FINISHED"}


@pytest.mark.parametrize(
    "gain, signal, says",
    [
        (0.8, "scheme", "uses word order"),
        (0.01, "scheme", "NOT yet using word order (below report.min_order_gain=0.05): train longer"),
        (0.0, "none", "cannot use word order (no positional scheme, bidirectional)"),
    ],
)
def test_summary_says_whether_the_model_uses_word_order(gain, signal, says):
    from harness.train import Summary, format_summary

    s = Summary(
        "r",
        "pos=x",
        "sqlite:///m.db",
        "e",
        2.0,
        None,
        300,
        1000.0,
        10,
        1.0,
        gain,
        0.05,
        experiment_id="1",
        order_signal=signal,
    )
    assert f"order gain       {gain:+.4f} nats/token when word order is shuffled: {says}" in format_summary(s)


def test_a_preset_with_every_axis_pinned_is_one_run_plus_prefixed_axes_too(store, tmp_path):
    """A preset's sweep axis added with '+' (randomized_positions' arms) is pinned by the same '+…' override, not
    refused as an unpinned axis. What --check decides, not what a process adds: run.py's entry function in this
    interpreter (tests/inprocess.py)."""
    dirs = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/multirun"]
    env = {"MLFLOW_TRACKING_URI": store}
    pinned = ["experiment=randomized_positions", "pos=rope", "+experiment/randomized_positions/arm=randomized"]
    out = inprocess.run("run", ["--check", *pinned, "seed=0", *dirs], str(tmp_path), env, HANG)
    assert out["code"] == 0, out["stderr"][-2000:]
    out = inprocess.run(
        "run", ["--check", "experiment=randomized_positions", "pos=rope", "seed=0", *dirs], str(tmp_path), env, HANG
    )
    assert out["code"] == 2 and "is a sweep over +experiment/randomized_positions/arm: add -m" in out["stderr"]


def test_the_command_prints_the_overrides_a_run_takes_as_they_are(tmp_path):
    """``posbench hf-rope CONFIG`` reads a config.json (or its folder) and prints the overrides for ``posbench run
    $(posbench hf-rope CONFIG)``, the documented use: a ``$(…)`` splits words and removes no quote, so the overrides
    hold no space and Hydra's own quotes are printed as they are — and the check of that very command passes. bash
    splits what the command printed (``$(cat FILE)`` splits as ``$(…)`` does); both commands are their entry
    functions in this interpreter (tests/inprocess.py): the point is the shell's words, not a process."""
    (tmp_path / "config.json").write_text(json.dumps(gemma3().to_dict()))
    out = inprocess.run("posbench", ["hf-rope", str(tmp_path)], str(ROOT), {}, HANG)  # what the $(…) gets
    assert out["code"] == 0, out["stderr"]
    assert "+attn.layers=['local(window=16)'," in out["stdout"] and "model.n_layers=4" in out["stdout"]
    (tmp_path / "printed").write_text(out["stdout"])
    words = subprocess.run(
        ["bash", "-c", 'printf "%s\\0" $(cat "$1")', "bash", str(tmp_path / "printed")],
        cwd=ROOT,  # where a user's $(…) would expand a glob
        capture_output=True,
        text=True,
        timeout=HANG,
        check=True,
    ).stdout.split("\0")[:-1]
    run = inprocess.run("run", ["check", *words, "trainer.max_steps=2"], str(ROOT), {}, HANG)
    assert run["code"] == 0 and run["stdout"].startswith("ok: pos=rope"), run["stderr"][-2000:]
