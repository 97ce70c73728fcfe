"""paper: the tests that train end to end (the rest: tests/unit/test_paper.py).

Paper-claim reports: the statistics against textbook values, verdict rules, and one preset end to end.
"""

import argparse

from tests.helpers import assert_figure, run_sweep


def test_preset_sweep_then_paper_report(store, tmp_path):
    from results.paper import main
    from results.store import find_sweep

    s = run_sweep(tmp_path, "experiment=roformer_mlm", "seed=0,1", in_process=True)
    assert s.proc.returncode == 0, s.proc.stderr[-2000:]
    sweep = find_sweep(s.client, "paper-roformer_mlm")  # a preset logs to its own experiment
    assert sorted(r.data.tags["pos"] for r in sweep.runs) == [
        "learned",
        "learned",
        "rope",
        "rope",
        "sinusoidal",
        "sinusoidal",
    ]
    out = tmp_path / "results" / "roformer_mlm"
    args = argparse.Namespace(preset="roformer_mlm", scale="toy", sweep=None, out=str(out), tracking_uri=s.uri)
    assert main(args) == 0
    readme = (out / "README.md").read_text()
    assert (
        "Su et al. 2021" in readme
        and "val/loss: pos=rope − pos=learned" in readme
        and "pos=rope − pos=sinusoidal" in readme
    )
    assert (
        [line for line in readme.splitlines() if line.startswith("**Verdict")]
        == [line for line in readme.splitlines() if line.startswith("**Verdict: ")]
        != []
    )  # one verdict: the claim's
    assert "### Final val loss against the sweep's baseline (not the claim's verdict)" in readme  # claim on val/loss
    assert "| final bits/byte |" in readme  # a text task: loss per byte beside nats per token
    assert f"--sweep {sweep.sweep_id}" in readme and "torch 2." in readme
    minutes = (sweep.parent.info.end_time - sweep.parent.info.start_time) / 60000  # the parent run's span
    launcher = sweep.parent.data.tags["hydra_overrides"]  # run_sweep's hydra.* overrides, e.g. the sweep dir
    wall = next(line for line in readme.splitlines() if line.startswith("Wall time: "))
    assert wall.startswith(f"Wall time: {minutes:.1f} min for {len(sweep.runs)} runs with `{launcher}` on host"), wall
    assert f"--sweep {sweep.sweep_id} --out {out}/`" in readme  # the sweep report's Regenerate line names where it is
    assert (out / "report.csv").exists() and "roformer_mlm" in (tmp_path / "results" / "README.md").read_text()


def test_trainable_theta_report_shows_drift_and_per_frequency_ratios(store, tmp_path):
    """su_trainable_theta's report reads θ back from MLflow: the drift curve, θ_final/θ₀ per
    frequency from each run's theta.csv artifact, and a per-seed table."""
    import csv

    from results.paper import main

    s = run_sweep(tmp_path, "experiment=su_trainable_theta", "seed=0", "trainer.log_every_n_steps=1", in_process=True)
    assert s.proc.returncode == 0, s.proc.stderr[-2000:]
    out = tmp_path / "results" / "su_trainable_theta"
    args = argparse.Namespace(preset="su_trainable_theta", scale="toy", sweep=None, out=str(out), tracking_uri=s.uri)
    assert main(args) == 0
    readme = (out / "README.md").read_text()
    assert "## θ drift" in readme and "![theta_ratio](theta_ratio.png)" in readme
    final = s.client.get_run(
        next(
            r.info.run_id
            for r in s.client.search_runs([s.client.get_experiment_by_name("paper-su_trainable_theta").experiment_id])
            if r.data.tags.get("pos") == "rope_trainable"
        )
    ).data.metrics
    # two comparisons on one arm: each reads its own metric
    assert f"theta_rel_change of pos=rope_trainable < 0.05: per seed {final['pos/theta_rel_change']:.4g}" in readme
    ratio = final["pos/theta_max_log_ratio"]
    assert f"theta_max_log_ratio of pos=rope_trainable < 0.0953: per seed {ratio:.4g}" in readme
    rows = list(csv.DictReader(open(out / "theta.csv")))
    assert len(rows) == 8 and float(rows[0]["theta0"]) == 1.0  # tiny model: head dim 16, 8 frequencies, θ₀ = 1 first
    assert all(float(r["ratio_seed0"]) != 0 for r in rows)
    assert_figure(out / "theta_ratio.png")
    assert_figure(out / "theta_drift.png")
