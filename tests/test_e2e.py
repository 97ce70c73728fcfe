"""End to end: tiny runs through the real training path, checked from the MLflow store."""

import math

import pytest

pytestmark = pytest.mark.slow


def test_mlm_run_logs_contract(train_tiny):
    summary, client = train_tiny("pos=rope")
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "pos=rope attn=softmax seed=0"
    for tag in ("pos", "attn", "task", "data", "seed", "git_sha", "corpus_sha256"):
        assert run.data.tags[tag]
    assert run.data.tags["pos"] == "rope" and run.data.tags["task"] == "mlm"
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
