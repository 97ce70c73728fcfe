"""The benchmark harness: FLOP counting against an analytic count, and a tiny end-to-end grid."""

import csv

import pytest
import torch

from harness import allocator
from harness.bench.cells import Spec, build_posbench
from harness.bench.cli import main
from harness.bench.measure import PeakRss, count_flops, make_step, matmul_peak_flops, measure
from tests.helpers import assert_figure


def test_flops_of_a_linear_step_match_the_analytic_count():
    """forward 2·N·in·out, backward twice that (grad input, grad weight)."""
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(10, 64, requires_grad=True)
    flops = count_flops(lambda: layer(x).sum().backward())
    assert flops == 3 * 2 * 10 * 64 * 32


def test_model_flops_grow_with_the_dense_part_analytically():
    """Doubling the batch at fixed T doubles every matmul, attention included."""
    one = Spec("none", "softmax", 64, 1)
    model, forward = build_posbench(one)
    ids1, ids2 = torch.randint(256, (1, 64)), torch.randint(256, (2, 64))
    f1 = count_flops(make_step(forward, model, ids1, autocast=False))
    f2 = count_flops(make_step(forward, model, ids2, autocast=False))
    assert f2 == pytest.approx(2 * f1)
    # dense matmuls of the small model (4 layers, C=128, F=512, V=258) alone, 3× for fwd+bwd
    C, F, V, L, T = 128, 512, 258, 4, 64
    dense = 3 * 2 * T * (L * (4 * C * C + 2 * C * F) + C * C + C * V)
    H, D = 4, 32
    attention = L * (4 * H * T * T * D) * (1 + 2.5)  # QKᵀ and PV forward; backward 2.5× (torch's SDPA formula)
    assert f1 == pytest.approx(dense + attention)


def test_measure_stops_repeating_once_a_cell_has_used_its_time():
    import time

    def step():
        time.sleep(0.03)
    assert measure(step, 10, "cpu", warmup=0, repeats=5, cell_s=0.05)["repeats"] == 2  # 0.03 + 0.03 ≥ 0.05
    assert measure(step, 10, "cpu", warmup=0, repeats=3)["repeats"] == 3
    assert measure(step, 10, "cpu", warmup=0, repeats=3, cell_s=0.0)["repeats"] == 1  # always at least one


def test_peak_matmul_reports_the_size_that_reached_it():
    peak, n = matmul_peak_flops("cpu", sizes=(64, 128), seconds=0.05)
    assert n in (64, 128) and peak > 1e6


def test_peak_rss_sees_an_allocation():
    with PeakRss() as rss:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del x
    assert rss.delta_mb > 48


@pytest.mark.slow
def test_tiny_bench_writes_report_and_mlflow_runs(tmp_path, store, monkeypatch):
    from mlflow.tracking import MlflowClient

    from harness.bench import cli

    # the commit is read once, when the run starts: writing into a tracked --out (results/bench) makes the
    # tree dirty, and the report said "-dirty" of a clean commit
    described = iter(["c0ffee", "c0ffee-dirty"])
    monkeypatch.setattr(cli, "git_sha", lambda: next(described))
    code = main(["--pos", "none,rope", "--attn", "softmax", "--lengths", "32,64", "--tokens", "128",
                 "--repeats", "1", "--no-peers", "--no-targets", "--out", str(tmp_path)])
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



def test_causal_cells_bench_a_causal_only_scheme(tmp_path):
    """--causal builds the grid's cells as causal LMs: pos=fox (defined causal only) is refused without it."""
    from dataclasses import replace

    from harness.bench.cli import _lengths_of, parse
    from harness.bench.session import Options, Session

    args = parse(["--pos", "fox", "--attn", "softmax", "--lengths", "16", "--tokens", "32", "--causal",
                  "--out", str(tmp_path), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"])
    session = Session(Options("cpu", 1e9, repeats=1, cell_s=0.1))
    [causal] = _lengths_of(session, args, "fox", "softmax")
    assert args.causal and causal.status == "ok" and causal.step_s > 0
    [bidirectional] = _lengths_of(session, replace(args, causal=False), "fox", "softmax")
    assert bidirectional.status == "refused" and "pos=fox with a bidirectional task" in bidirectional.reason
