"""The benchmark harness: FLOP counting against an analytic count, and a tiny end-to-end grid."""

import pytest
import torch

from harness.bench.cells import Spec, build_posbench
from harness.bench.measure import PeakRss, count_flops, make_step, matmul_peak_flops, timed_steps


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

    assert len(timed_steps(step, "cpu", warmup=0, repeats=5, cell_s=0.05)) == 2  # 0.03 + 0.03 ≥ 0.05
    assert len(timed_steps(step, "cpu", warmup=0, repeats=3)) == 3
    assert len(timed_steps(step, "cpu", warmup=0, repeats=3, cell_s=0.0)) == 1  # always at least one


def test_peak_matmul_reports_the_size_that_reached_it():
    peak, n = matmul_peak_flops("cpu", sizes=(64, 128), seconds=0.05)
    assert n in (64, 128) and peak > 1e6


def test_peak_rss_sees_an_allocation():
    with PeakRss() as rss:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del x
    assert rss.delta_mb > 48


def test_causal_cells_bench_a_causal_only_scheme(tmp_path):
    """--causal builds the grid's cells as causal LMs: pos=fox (defined causal only) is refused without it."""
    from dataclasses import replace

    from harness.bench.cli import _lengths_of, parse
    from harness.bench.session import Options, Session

    args = parse(
        [
            "--pos",
            "fox",
            "--attn",
            "softmax",
            "--lengths",
            "16",
            "--tokens",
            "32",
            "--causal",
            "--out",
            str(tmp_path),
            "--tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
        ]
    )
    session = Session(Options("cpu", 1e9, repeats=1, cell_s=0.1))
    [causal] = _lengths_of(session, args, "fox", "softmax")
    assert args.causal and causal.status == "ok" and causal.step_s > 0
    [bidirectional] = _lengths_of(session, replace(args, causal=False), "fox", "softmax")
    assert bidirectional.status == "refused" and "pos=fox with a bidirectional task" in bidirectional.reason
