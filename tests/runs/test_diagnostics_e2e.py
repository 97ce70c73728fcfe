"""diagnostics: the tests that train end to end (the rest: tests/unit/test_diagnostics.py).

Attention diagnostics: the statistics against hand-computed values, a model whose attention is set by
hand, the files, the report panel, and tiny runs with diagnostics=true for every variant read back from MLflow.
"""

from __future__ import annotations

import csv
import math

import pytest

from harness.config.catalog import option_classes

# every attention option that says which weights it applies (diagnostics=true refuses the others)
VARIANTS = sorted(name for name, cls in option_classes("attn").items() if cls.implies_weights())


@pytest.fixture(scope="module")
def diagnosed_runs(train_tiny_shared):
    """One tiny run per variant with diagnostics=true (2 steps: the pictures of a barely trained model)."""
    return {
        attn: train_tiny_shared(
            "diagnostics=true", f"attn={attn}", "trainer.max_steps=2", "trainer.val_check_interval=2"
        )
        for attn in VARIANTS
    }


@pytest.mark.parametrize("attn", VARIANTS)
def test_a_run_with_diagnostics_attaches_them_for_every_variant(diagnosed_runs, attn):
    from results.store import cell_of

    summary, client = diagnosed_runs[attn]
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    names = {a.path.split("/")[-1] for a in client.list_artifacts(summary.run_id, "diagnostics")}
    assert names == {
        "attention_stats.csv",
        "attention_by_offset.csv",
        "attention_distance.png",
        "attention_entropy.png",
        "attention_by_offset.png",
        "attention_maps.png",
    }
    metrics = run.data.metrics
    T = 32  # TINY's data.seq_len
    assert 0.0 < metrics["diag/mean_distance"] < T - 1 and 0.0 < metrics["diag/entropy"] <= math.log(T) + 1e-6
    assert metrics["diag/weights_error"] < 1e-4
    history = client.get_metric_history(summary.run_id, "diag/mean_distance")
    assert [m.step for m in history] == [summary.step]
    stats = client.download_artifacts(summary.run_id, "diagnostics/attention_stats.csv")
    rows = list(csv.DictReader(open(stats)))
    assert len(rows) == 2 * 2  # TINY: 2 layers × 2 heads
    mean = sum(float(r["mean_distance"]) for r in rows) / len(rows)
    assert mean == pytest.approx(metrics["diag/mean_distance"], rel=1e-5)
    assert (
        cell_of(client, run).metrics["diag/mean_distance"] == metrics["diag/mean_distance"]
    )  # what the sweep report reads
