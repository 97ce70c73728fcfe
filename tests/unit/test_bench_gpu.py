"""The GPU check (harness/bench/gpu.py, flex.py, gpu_report.py) on a CPU: the estimate it sets against the
measured peak is the figure ``--check --gpu-memory`` prints; a bias as a flex score_mod is the dense bias
(forward and every gradient, fp64, through a reference that applies the score_mod as flex defines it); the
committed report is what ``--render`` writes from the committed CSVs; a run writes every section it ran."""

from __future__ import annotations

import csv
import math
import re
import shutil

import pytest
import torch

from harness import integrity
from harness.bench import flex, gpu, gpu_memory
from harness.bench.internals import build_transformer
from tests import inprocess
from tests.helpers import ROOT

COMMITTED = ROOT / "results" / "bench_gpu"
SMALL = ("model.n_layers=1", "model.d_model=64", "model.n_heads=2", "model.d_ff=128")


def test_the_estimate_is_the_figure_check_gpu_memory_prints():
    argv = [
        "experiment=eleuther_rotary",
        "scale=paper",
        "pos=rope",
        "seed=0",
        "data.batch_size=8",
        "~paper",
        "budget.max_epochs=null",
    ]  # the embedded corpus's bytes stand in, on purpose
    done = inprocess.run("run", ["--check", "--gpu-memory", "80GB", *argv], str(ROOT), {})
    assert done["code"] == 0, done["stderr"]
    printed = re.search(r"a training step needs about (.*\)), fits", done["stdout"]).group(1)
    cell = gpu_memory.MemoryCell("eleuther_rotary", "rope", True, 258, (8,))  # the embedded corpus' bytes
    assert gpu_memory.estimate(cell, 8)[1].summary() == printed


def test_the_bench_optimizes_the_parameters_training_optimizes():
    """A frozen parameter is in neither the memory bench's optimizer nor training's: the same groups, the same
    tensors in each (harness/model/module.py's configure_optimizers)."""
    from types import SimpleNamespace

    from harness.bench.internals import compose_cell, composed_model
    from harness.model.module import LanguageModel

    spec = compose_cell(["experiment=eleuther_rotary", *SMALL, "data.seq_len=16", "model.loss_chunk=null"])
    model = composed_model(spec, 300, True, "cpu")
    model.blocks[0].norm1.weight.requires_grad_(False)  # frozen
    handed = []

    def build(groups):
        handed.append([[id(p) for p in g["params"]] for g in groups])
        return spec.optimizer.build(groups)

    module = LanguageModel(model, build, spec.schedule.build(), None)
    module.trainer = SimpleNamespace(max_steps=1)  # only the schedule's length is read
    module.configure_optimizers()
    ids = torch.randint(300, (2, 16))
    bench_cfg = SimpleNamespace(optimizer=SimpleNamespace(build=build), model=spec.model)
    gpu_memory.train_steps(bench_cfg, model, ids, ids.roll(-1, dims=1), 1, bf16=False)
    training, bench = handed
    assert id(model.blocks[0].norm1.weight) not in training[1]
    assert bench == training


def reference_flex(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
    """flex_attention's definition, materialised: score_mod(q·kᵀ/√D, b, h, i, j), the causal mask, softmax."""
    B, H, T, D = q.shape
    b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
    i, j = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    if block_mask is not None:
        scores = scores.masked_fill(~flex.causal(b, h, i, j), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("name", gpu.FLEX_SCHEMES)
def test_a_bias_as_score_mod_is_the_dense_bias_in_fp64(name):
    torch.manual_seed(0)
    T = 48
    scheme = build_transformer(
        [f"pos={name}", *SMALL, "model.dropout=0.0", f"data.seq_len={T}"], 258, T, True
    ).pos.double()
    q, k, v = (torch.randn(2, 2, T, 32, dtype=torch.float64) for _ in range(3))
    p = flex.parity(scheme, q, k, v, reference_flex, lambda *a, **kw: "causal")
    assert p.out_err < 1e-13
    learned = {f"pos.{n}" for n, t in scheme.named_parameters() if t.requires_grad}
    assert {"q", "k", "v"} | learned <= set(p.grad_err) | {n for n in learned if n in p.note}
    assert max(p.grad_err.values()) < 1e-11, p.grad_err
    assert ("≈ 0 in both" in p.note) == (name == "fire")  # FIRE's output bias: gradient 0 by shift invariance


def test_a_wrong_table_offset_is_caught():
    """The parity check can fail: the score_mod reading the table one offset off is not the dense bias."""
    T = 16
    scheme = build_transformer(["pos=t5", *SMALL, "model.dropout=0.0", f"data.seq_len={T}"], 258, T, True).pos
    bias = scheme.logit_bias(scheme.positions(T), 0)
    table, last = bias.table, bias.t_k - 1

    def off_by_one(score, b, h, q, kv):
        return score + table[h, (q - kv + last + 1).clamp(max=table.shape[1] - 1)]

    q, k, v = (torch.randn(1, 2, T, 32) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=flex.dense_mask(bias, T, q.dtype))
    assert (reference_flex(q, k, v, off_by_one, "causal") - dense).abs().max() > 1e-4


def test_the_committed_report_is_what_render_writes(tmp_path):
    copy = tmp_path / "bench_gpu"
    shutil.copytree(COMMITTED, copy)
    gpu.main(["--out", str(copy), "--render"])
    assert (copy / "README.md").read_text() == (COMMITTED / "README.md").read_text(), (
        "results/bench_gpu/README.md is stale: python -m harness.bench.gpu --out results/bench_gpu --render"
    )


def test_the_committed_memory_rows_fit_the_estimate_at_this_commit():
    """The measured H200 peaks against today's formula: at or under the estimate, within 5 %."""
    with (COMMITTED / "memory.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    assert len(rows) >= 6
    for r in rows:
        cell = next(c for c in gpu_memory.MEMORY_CELLS if c.preset == r["preset"])
        estimate = gpu_memory.estimate(cell, int(r["batch"]))[1].total / 2**30
        assert 0.95 <= float(r["measured_gib"]) / estimate <= 1.0, (r["preset"], r["batch"])


def test_a_cpu_run_writes_each_section_it_ran(tmp_path, monkeypatch):
    cell = gpu_memory.MemoryCell("eleuther_rotary", "rope", True, 300, (2,), (*SMALL, "data.seq_len=32"))
    monkeypatch.setattr(gpu, "MEMORY_CELLS", (cell,))
    monkeypatch.setattr(gpu, "D768", SMALL)
    monkeypatch.setattr(gpu, "STEP_CELLS", (("rope", "softmax"),))
    monkeypatch.setattr(gpu, "BF16_SCHEMES", ("rope",))
    monkeypatch.setattr(gpu, "BF16_STEP", (2, 32))
    assert (
        gpu.main(
            [
                "--out",
                str(tmp_path),
                "--length",
                "32",
                "--tokens",
                "64",
                "--steps",
                "3",
                "--sections",
                "memory,steps,cuda",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md",
        "SHA256SUMS",
        "cuda.csv",
        "memory.csv",
        "run.log",
        "steps.csv",
    ]
    assert integrity.check_report(tmp_path, "")  # each file as the run left it
    (tmp_path / "steps.csv").write_text((tmp_path / "steps.csv").read_text().replace("rope", "r0pe"))
    assert gpu.main(["--out", str(tmp_path), "--render"]) == 2  # --render reads the CSVs back: checked first
    text = (tmp_path / "README.md").read_text()
    assert "| eleuther_rotary | 2 | 32 | 300 |" in text and "| rope | softmax | 2 |" in text
    assert "refused in one line" in text  # no CUDA here: backend=xformers is refused in one line


def test_unknown_sections_are_refused(tmp_path, capsys):
    assert gpu.main(["--out", str(tmp_path), "--sections", "memory,speed"]) == 2
    assert capsys.readouterr().err.strip() == "error: --sections speed: use some of memory,steps,peers,flex,cuda"
    assert not list(tmp_path.iterdir())
