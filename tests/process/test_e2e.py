"""End to end: tiny runs through the real training path, checked from the MLflow store."""

import hashlib
import math
import platform
import subprocess

import pytest

from harness import allocator
from harness.data.corpus import CACHE
from tests.helpers import ROOT


def test_mlm_run_logs_contract(train_tiny):
    summary, client = train_tiny("pos=rope")
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "pos=rope attn=softmax seed=0"
    for tag in ("pos", "attn", "task", "data", "seed", "git_sha", "corpus_sha256"):
        assert run.data.tags[tag]
    assert run.data.tags["pos"] == "rope" and run.data.tags["task"] == "mlm"
    assert run.data.tags["malloc"] == allocator.setting()  # this process left malloc alone; run.py turns mmap off
    assert run.data.tags["attn_backend"] == "sdpa"  # the kernel softmax attention ran (attn.backend=sdpa)
    assert (run.data.tags["data"], run.data.tags["seed"]) == ("embedded", "0")
    described = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert run.data.tags["git_sha"] == (described or "unknown")
    corpus = (CACHE / f"stdlib-prose-{platform.python_version()}.txt").read_bytes()  # the embedded corpus
    assert run.data.tags["corpus_sha256"] == hashlib.sha256(corpus).hexdigest()
    assert run.data.params["corpus.bytes"] == str(len(corpus))
    assert run.data.params["model.d_model"] == "32"
    val = client.get_metric_history(summary.run_id, "val/loss")
    assert [m.step for m in val] == [3, 6]
    assert val[-1].value == pytest.approx(summary.val_loss)
    bpc = client.get_metric_history(summary.run_id, "val/bpc")
    assert bpc[-1].value == pytest.approx(summary.val_loss / math.log(2))
    train = client.get_metric_history(summary.run_id, "train/loss")
    assert sorted(m.step for m in train) == list(range(1, 7))
    assert all(math.isfinite(m.value) for m in train)
    artifacts = [a.path for a in client.list_artifacts(summary.run_id)]
    assert "config.yaml" in artifacts


def test_loss_decreases_on_a_fixed_seed(train_tiny):
    summary, client = train_tiny(
        "trainer.max_steps=40", "trainer.val_check_interval=10", "optim.optimizer.lr=3e-3", "model.dropout=0.0"
    )
    val = [m.value for m in sorted(client.get_metric_history(summary.run_id, "val/loss"), key=lambda m: m.step)]
    assert len(val) == 4 and val[-1] < val[0] - 0.3
    train = sorted(client.get_metric_history(summary.run_id, "train/loss"), key=lambda m: m.step)
    first, last = sum(m.value for m in train[:5]) / 5, sum(m.value for m in train[-5:]) / 5
    assert last < first - 0.3
    tps = client.get_metric_history(summary.run_id, "train/tokens_per_s")
    assert tps and all(m.value > 0 for m in tps)
    lr = sorted(client.get_metric_history(summary.run_id, "lr"), key=lambda m: m.step)
    assert lr[0].value < lr[2].value  # warmup
    assert lr[-1].value < max(m.value for m in lr)  # then decay


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_logged_learning_rate_follows_the_schedule_formula(train_tiny, decay):
    """lr after k optimizer steps = base · f(k): linear warmup (k+1)/W for k < W, then cosine
    m + (1 − m)·(1 + cos πp)/2, linear m + (1 − m)(1 − p) or constant 1, with p = (k − W)/(T − W).
    The point logged at MLflow step s (steps completed) was read during step s, after s − 1 updates."""
    base, warmup, total, floor = 2e-3, 3, 12, 0.2
    summary, client = train_tiny(
        f"trainer.max_steps={total}",
        f"optim.optimizer.lr={base}",
        f"optim.schedule.warmup_steps={warmup}",
        f"optim.schedule.decay={decay}",
        f"optim.schedule.min_lr_ratio={floor}",
    )

    def expected(k: int) -> float:
        if k < warmup:
            return base * (k + 1) / warmup
        p = (k - warmup) / (total - warmup)
        shape = {"cosine": (1 + math.cos(math.pi * p)) / 2, "linear": 1 - p, "constant": None}[decay]
        return base if shape is None else base * (floor + (1 - floor) * shape)

    logged = sorted(client.get_metric_history(summary.run_id, "lr"), key=lambda m: m.step)
    assert [m.step for m in logged] == list(range(1, total + 1))
    for m in logged:
        assert m.value == pytest.approx(expected(m.step - 1), rel=1e-6), m.step


def test_same_seed_same_curve(train_tiny):
    a, client = train_tiny("pos=learned")
    b, _ = train_tiny("pos=learned")
    assert a.val_loss == b.val_loss


def test_clm_run(train_tiny):
    summary, client = train_tiny("task=clm", "pos=sinusoidal")
    run = client.get_run(summary.run_id)
    assert run.info.run_name == "pos=sinusoidal attn=softmax seed=0 task=clm"
    assert run.data.tags["task"] == "clm" and math.isfinite(summary.val_loss)


def test_crash_ends_run_failed(train_tiny, monkeypatch):
    from harness.model.module import LanguageModel

    def explode(self, batch, batch_idx):
        raise RuntimeError("boom")

    monkeypatch.setattr(LanguageModel, "training_step", explode)
    with pytest.raises(RuntimeError, match="boom"):
        train_tiny()
    import os

    from mlflow.tracking import MlflowClient

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
