"""phases: the tests that start real processes (the rest: tests/unit/test_phases.py).

Positional phases (``phases``): a run changes its scheme, its scaling or its training length at stated steps.
The state at a step by the rules, the model after a boundary against a model built that way, bad phases refused
in one line, the boundaries read back from MLflow, and a run killed past a boundary resumed exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import HANG, ROOT, TINY

CONSTANT = ["task=clm", "optim.schedule.decay=constant", "optim.schedule.warmup_steps=2", "model.dropout=0.0"]


def test_a_drope_run_logs_its_boundary_and_trains_the_plain_runs_weights_up_to_it(train_tiny):
    """With a constant rate after warm-up, a run that drops RoPE at step 6 is, up to step 6, the plain RoPE run of
    6 steps (the same seed, the same batches): its val/loss there is that run's final one. After it train/phase
    is 1 and the final evaluation reads the model without positions."""
    plain, client = train_tiny(*CONSTANT, "trainer.max_steps=6", "trainer.val_check_interval=3")
    drope, _ = train_tiny(
        *CONSTANT,
        "trainer.max_steps=9",
        "trainer.val_check_interval=3",
        "phases=[{at:6,pos:none}]",
        "eval.lengths=[32,64]",
    )
    phase = sorted((m.step, m.value) for m in client.get_metric_history(drope.run_id, "train/phase"))
    assert [v for s, v in phase if s <= 6] == [0.0] * 6 and [v for s, v in phase if s > 6] == [1.0] * 3
    val = dict((m.step, m.value) for m in client.get_metric_history(drope.run_id, "val/loss"))
    assert abs(val[6] - plain.val_loss) <= 1e-6, (val[6], plain.val_loss)
    run = client.get_run(drope.run_id)
    assert run.data.tags["phases"] == "0: pos=rope · 6: pos=none" and run.info.status == "FINISHED"
    assert {"val/loss_at_32", "val/loss_at_64"} <= set(run.data.metrics)


def test_the_final_val_loss_of_a_scaling_phase_does_not_depend_on_the_validation_interval(train_tiny):
    """5 steps with linear scaling from step 2: validated inside fit at step 5 (interval 5), or by the validation
    after fit (interval 2), the final model scores the same."""
    args = [*CONSTANT, "trainer.max_steps=5", "phases=[{at:2,scaling:linear,factor:8}]"]
    inside, _ = train_tiny(*args, "trainer.val_check_interval=5")
    after, _ = train_tiny(*args, "trainer.val_check_interval=2")
    assert inside.step == after.step == 5 and inside.val_loss == after.val_loss, (inside.val_loss, after.val_loss)


@pytest.fixture
def float32():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(previous)


def test_a_run_killed_past_a_boundary_resumes_in_its_phase(store, tmp_path, train_tiny, float32):
    """kill -9 before step 7 of 10, RoPE dropped at step 3, the last checkpoint at step 4: the resumed run trains
    steps 5-10 without RoPE and ends where the uninterrupted run does."""
    from mlflow.tracking import MlflowClient

    args = [
        *CONSTANT,
        "trainer.max_steps=10",
        "trainer.val_check_interval=3",
        "checkpoint.every_n_steps=4",
        "phases=[{at:3,pos:none}]",
    ]
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    killed = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "killer.py"), "6", *TINY, *args, f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed, client = train_tiny(*args, "resume=true")
    reference, _ = train_tiny(*args)
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == "4"
    for key in ("train/loss", "val/loss", "train/phase"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(resumed.run_id, key))
        want = sorted((m.step, m.value) for m in MlflowClient(store).get_metric_history(reference.run_id, key))
        assert [s for s, _ in got] == [s for s, _ in want]
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6, key
    assert abs(resumed.val_loss - reference.val_loss) <= 1e-6
