"""bench: the tests that train end to end (the rest: tests/unit/test_bench.py).

The benchmark harness: FLOP counting against an analytic count, and a tiny end-to-end grid.
"""

import csv

import torch

from harness import allocator
from harness.bench.cli import main
from harness.bench.measure import matmul_peak_flops
from tests.helpers import assert_figure


def test_tiny_bench_writes_report_and_mlflow_runs(tmp_path, store, monkeypatch):
    from mlflow.tracking import MlflowClient

    from harness.bench import cli

    # the commit is read once, when the run starts: writing into a tracked --out (results/bench) makes the
    # tree dirty, and the report said "-dirty" of a clean commit
    described = iter(["c0ffee", "c0ffee-dirty"])
    monkeypatch.setattr(cli, "git_sha", lambda: next(described))
    # the peak matmul rate the MFU column divides by, measured on small matrices for a short while: no assertion reads
    # its value (tests/unit/test_bench.py tests the measure); the default multiplies 4096² matrices for whole seconds
    monkeypatch.setattr(cli, "matmul_peak_flops", lambda device, sizes: matmul_peak_flops(device, (64, 128), 0.05))
    code = main(
        [
            "--pos",
            "none,rope",
            "--attn",
            "softmax",
            "--lengths",
            "32,64",
            "--tokens",
            "128",
            "--repeats",
            "1",
            "--no-peers",
            "--no-targets",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert {(r["pos"], r["seq_len"]) for r in rows} == {("none", "32"), ("none", "64"), ("rope", "32"), ("rope", "64")}
    assert all(r["status"] == "ok" and float(r["step_s"]) > 0 and float(r["flops"]) > 0 for r in rows)
    assert int(rows[0]["batch"]) * int(rows[0]["seq_len"]) == 128  # tokens per step held constant
    assert_figure(tmp_path / "step_time.png")
    assert_figure(tmp_path / "memory.png")
    report = (tmp_path / "README.md").read_text()
    assert "| none | softmax | 32 |" in report
    assert f"Allocator: {allocator.setting()} (harness/allocator.py)." in report
    assert f"torch {torch.__version__}, commit c0ffee. " in report
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    assert len(runs) == 4 and all(r.data.metrics["tokens_per_s"] > 0 for r in runs)
    assert {r.data.tags["git_sha"] for r in runs} == {"c0ffee"}
