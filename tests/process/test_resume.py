"""Exact resume after a real SIGKILL, reconciliation of killed runs, resumable sweeps.

The interruption is honest: the training process is SIGKILLed mid-run (tests/killer.py), with
the run's final trainer.max_steps, so the LR schedule's length is the same as uninterrupted.
"""

import os
import subprocess
import sys

import pytest

from tests import inprocess
from tests.helpers import HANG, ROOT, TINY

# 10 steps, validation every 3, a checkpoint every 4; killed before step 7: the committed
# checkpoint is step 4, and the store already holds points for steps 5 and 6.
LONG = ["trainer.max_steps=10", "trainer.val_check_interval=3", "checkpoint.every_n_steps=4"]


@pytest.fixture(autouse=True)
def float32():
    """The killed subprocess trains in float32; an in-process resume must too (test_foundation_math
    sets float64 as the default dtype for the whole session when it is imported)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(previous)


def kill_at(step: int, store: str, tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """run.py in a subprocess that SIGKILLs itself before optimizer step ``step`` + 1."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "killer.py"), str(step), *args, f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]  # died by SIGKILL, not by an error
    return proc


def only_run(client):
    [run] = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    return run


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_resumed_run_is_the_same_run_with_contiguous_steps_and_equal_loss(store, tmp_path, train_tiny):
    from mlflow.tracking import MlflowClient

    kill_at(6, store, tmp_path, *TINY, *LONG)
    client = MlflowClient(store)
    killed = only_run(client)
    assert killed.info.status == "RUNNING"  # what SIGKILL leaves behind
    assert [s for s, _ in history(client, killed.info.run_id, "train/loss")] == [1, 2, 3, 4, 5, 6]

    resumed, _ = train_tiny(*LONG, "resume=true")
    reference, _ = train_tiny(*LONG)  # uninterrupted, same config: a new run

    assert resumed.run_id == killed.info.run_id
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == "4"
    assert "failure" not in run.data.tags
    for key in ("train/loss", "lr", "val/loss"):
        got, want = history(client, resumed.run_id, key), history(client, reference.run_id, key)
        assert [s for s, _ in got] == [s for s, _ in want]  # contiguous, no step written twice
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6
    assert [s for s, _ in history(client, resumed.run_id, "val/loss")] == [3, 6, 9, 10]
    assert abs(resumed.val_loss - reference.val_loss) <= 1e-6
    print(f"resumed - uninterrupted final val loss: {resumed.val_loss - reference.val_loss:.3e}")


def test_sigkill_before_any_checkpoint_is_reconciled_as_killed(store, tmp_path, train_tiny):
    from mlflow.tracking import MlflowClient

    from harness.errors import ConfigError

    kill_at(2, store, tmp_path, *TINY, *LONG)  # the first checkpoint would be step 4
    client = MlflowClient(store)
    killed = only_run(client)
    assert killed.info.status == "RUNNING"
    with pytest.raises(ConfigError, match="resume=true: no checkpoint for this config"):
        train_tiny(*LONG, "resume=true")
    run = client.get_run(killed.info.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure"] == "killed"
    assert "died without closing it" in run.data.tags["failure_reason"]


def test_new_run_of_a_killed_config_closes_the_stale_run(store, tmp_path, train_tiny):
    from mlflow.tracking import MlflowClient

    kill_at(5, store, tmp_path, *TINY, *LONG)
    client = MlflowClient(store)
    killed = only_run(client)
    fresh, _ = train_tiny(*LONG)  # no resume=: a new run, and the dead one is closed
    assert fresh.run_id != killed.info.run_id
    run = client.get_run(killed.info.run_id)
    assert (run.info.status, run.data.tags["failure"]) == ("FAILED", "killed")
    assert "a new run of the same config" in run.data.tags["failure_reason"]


def test_rerun_sweep_skips_finished_cells_and_resumes_the_killed_one(store, tmp_path):
    from mlflow.tracking import MlflowClient

    overrides = ["pos=rope,learned", *LONG]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "killer.py"),
            "6",
            "-m",
            *TINY,
            *overrides,
            f"hydra.sweep.dir={tmp_path}/first",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": store, "KILL_POS": "learned"},
        timeout=HANG,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]

    # the same multirun again: the SIGKILL needed a real process, the rerun only reads what it left, so run.py's
    # entry runs in this process (tests/inprocess.py)
    argv = ["-m", *TINY, *overrides, f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    again = inprocess.run("run", argv, str(ROOT), {"MLFLOW_TRACKING_URI": store}, timeout=HANG)
    assert again["code"] == 0, again["stderr"][-3000:]
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])  # the newest first
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    [parent, old_parent] = parents
    assert (old_parent.info.status, old_parent.data.tags["failure"]) == ("FAILED", "killed")
    cells = [r for r in runs if r not in parents]
    rope, learned = (next(r for r in cells if r.data.tags["pos"] == p) for p in ("rope", "learned"))
    assert len(cells) == 2 and {r.info.status for r in cells} == {"FINISHED"}
    for run in cells:  # both listed under the new parent
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["sweep_id"] == parent.data.tags["sweep_id"]
    assert rope.data.tags["adopted_from_parent"] == old_parent.info.run_id  # skipped: not retrained
    assert rope.data.tags["skipped_in_sweep"] == parent.data.tags["sweep_id"]
    assert "skipped: pos=rope" in again["stdout"]
    assert learned.data.tags["resumed_from_step"] == "4"
    steps = [m.step for m in client.get_metric_history(learned.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, 11))
    assert "| learned | softmax | 0 | finished |" in parent.data.tags["mlflow.note.content"]


def test_resume_of_a_randomized_run_is_exact(store, tmp_path, train_tiny):
    """Randomized positions (Ruoss et al. 2023) are drawn from the step's own generator: a run killed at step 6 and
    resumed draws the same positions at steps 7 … 10 as the uninterrupted run."""
    from mlflow.tracking import MlflowClient

    randomized = ("pos=t5", "pos.randomize=true", "pos.max_position=96")
    kill_at(6, store, tmp_path, *TINY, *LONG, *randomized)
    resumed, _ = train_tiny(*LONG, *randomized, "resume=true")
    reference, _ = train_tiny(*LONG, *randomized)  # uninterrupted: a new run
    client = MlflowClient(store)
    got, want = history(client, resumed.run_id, "train/loss"), history(client, reference.run_id, "train/loss")
    assert [s for s, _ in got] == [s for s, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6
    assert abs(resumed.val_loss - reference.val_loss) <= 1e-6
