"""model.loss_chunk: the training loss from a chunk of tokens' logits at a time (harness/model/loss.py) is the
plain cross-entropy, value and gradients, and the memory estimate counts one chunk's logits."""

import pytest
import torch
import torch.nn.functional as F

from harness.config.resources import NamedGpu, SchemeTerms, check_gpu, gpu_estimate
from harness.errors import ConfigError
from harness.model.loss import summed_cross_entropy
from harness.model.transformer import ModelConfig
from results.store import run_windows
from tests.helpers import ROOT

IGNORE = -100


def _plain(h, w, b, y):  # as summed_loss without loss_chunk: bf16 logits reduced in fp32, fp64 kept
    z = F.linear(h, w, b)
    return F.cross_entropy(z.to(torch.promote_types(z.dtype, torch.float32)), y, ignore_index=IGNORE, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 7, 37, 64])  # one token, not dividing N, exactly N, more than N
@pytest.mark.parametrize("with_bias", [True, False])
def test_value_and_gradients_equal_the_plain_cross_entropy_in_fp64(chunk, with_bias):
    g = torch.Generator().manual_seed(0)
    N, C, V = 37, 8, 50
    h = torch.randn(N, C, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(V, C, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(V, dtype=torch.float64, generator=g, requires_grad=True) if with_bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[::5] = IGNORE  # unscored tokens: no loss, no gradient
    inputs = [h, w] + ([b] if with_bias else [])
    want, got = _plain(h, w, b, y), summed_cross_entropy(h, w, b, y, chunk, IGNORE)
    assert got.dtype == torch.float64 and got.item() == pytest.approx(want.item(), rel=1e-13)
    for a, c in zip(torch.autograd.grad(1.7 * want, inputs), torch.autograd.grad(1.7 * got, inputs), strict=True):
        torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12)
    assert (torch.autograd.grad(summed_cross_entropy(h, w, b, y, chunk, IGNORE), h)[0][::5] == 0).all()


def test_under_bf16_autocast_it_computes_the_logits_as_autocast_would():
    """The logits in bf16 from fp32 weights, reduced in fp32: the same value as the plain path to fp32 rounding;
    the gradients within bf16's rounding, in the inputs' own dtypes."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 16, generator=g, requires_grad=True)
    w = torch.randn(100, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 100, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = _plain(h, w, None, y), summed_cross_entropy(h, w, None, y, 16, IGNORE)
    assert got.dtype == torch.float32 and got.item() == pytest.approx(want.item(), rel=1e-6)
    for a, c in zip(torch.autograd.grad(want, [h, w]), torch.autograd.grad(got, [h, w]), strict=True):
        assert c.dtype == torch.float32
        assert (c - a).abs().max() <= 0.01 * a.abs().max()


def test_a_model_trains_the_same_with_and_without_chunks(train_tiny):
    """Three optimizer steps of the tiny model (fp32): every logged training loss and the final val loss agree."""
    plain, client = train_tiny("trainer.max_steps=3", "trainer.log_every_n_steps=1")
    chunked, _ = train_tiny("trainer.max_steps=3", "trainer.log_every_n_steps=1", "model.loss_chunk=5")

    def losses(run_id):
        return [m.value for m in client.get_metric_history(run_id, "train/loss")]

    assert len(losses(plain.run_id)) == 3
    assert losses(chunked.run_id) == pytest.approx(losses(plain.run_id), rel=1e-5)
    assert chunked.val_loss == pytest.approx(plain.val_loss, rel=1e-5)
    # each validation window's loss, recorded for results/spread.py: chunked one window at a time, the same
    plain_windows, chunked_windows = (run_windows(client, r.run_id) for r in (plain, chunked))
    assert plain_windows is not None and chunked_windows is not None
    assert chunked_windows["tokens"] == plain_windows["tokens"] and len(plain_windows["tokens"]) > 1
    assert chunked_windows["loss_sum"] == pytest.approx(plain_windows["loss_sum"], rel=1e-5)
    for run, windows in ((plain, plain_windows), (chunked, chunked_windows)):
        assert sum(windows["loss_sum"]) / sum(windows["tokens"]) == pytest.approx(run.val_loss, rel=1e-12)


@pytest.mark.parametrize(
    "value, words",
    [
        (0, "a positive number of tokens or null"),
        (-8, "a positive number of tokens or null"),
        (2.5, "an integer or null"),
        (True, "an integer or null"),
        ("many", "an integer or null"),
    ],
)
def test_a_chunk_that_is_not_a_positive_count_is_refused(value, words):
    """Built from Python, in the words the validation pass uses for model.loss_chunk (harness/ranges.py)."""
    with pytest.raises(ConfigError, match=rf"^model.loss_chunk=.* must be {words}$"):
        ModelConfig(loss_chunk=value)


GPT3_SMALL = dict(n_layers=12, d_model=768, n_heads=12, d_ff=3072, dropout=0.0)


def test_the_estimate_counts_one_chunks_logits_and_a_refusal_names_the_chunk_that_fits():
    """The EleutherAI 125M shape with GPT-2's vocabulary at 32×2048 tokens a step: the logits are 42.9 of 69.3 GiB
    whole, 5.4 GiB at 8,192 tokens a time (the blocks' terms unchanged); a GPU the whole logits overflow is told
    the largest power-of-two chunk that fits."""

    def estimate(chunk):
        return gpu_estimate(
            "a training step",
            "data.batch_size=32 or data.seq_len=2048",
            124_439_808,
            ModelConfig(**GPT3_SMALL, loss_chunk=chunk),
            50257,
            32,
            2048,
            "bf16-mixed",
            SchemeTerms(rotary=True),
        )

    whole, chunked = estimate(None), estimate(8192)
    assert whole.logits == 32 * 2048 * 50257 * (2 + 4 + 4 + 4) and chunked.logits == 8192 * 50257 * 14
    assert (chunked.states, chunked.activations) == (whole.states, whole.activations)
    assert chunked.summary().endswith("logits for 32×2048 tokens (8192 at a time))")
    assert estimate(10**9).logits == whole.logits  # a chunk larger than the step: the whole step's
    with pytest.raises(ConfigError) as e:
        check_gpu([whole], NamedGpu.parse("40GB"))
    room = NamedGpu.parse("40GB").memory - whole.states - whole.activations
    chunk = 2 ** (room // (50257 * 14)).bit_length() // 2
    assert chunk == 16384
    assert f"or make the logits {chunk} tokens at a time with model.loss_chunk={chunk}" in str(e.value)
    check_gpu([estimate(chunk)], NamedGpu.parse("40GB"))  # and it does fit


def test_the_committed_cpu_memory_table_is_the_benchmarks_own():
    """results/bench_cpu_memory/README.md is what the bench renders from its memory.csv, and its rows are the
    shapes and precisions the bench measures now."""
    import csv
    import math
    import re

    from harness.bench.cpu_memory import PRECISIONS, SHAPES, Row, render

    folder = ROOT / "results" / "bench_cpu_memory"
    with (folder / "memory.csv").open() as f:
        rows = [
            Row(
                **{
                    k: (v if k in ("shape", "precision") else float(v) if "." in v or "nan" in v else int(v))
                    for k, v in r.items()
                }
            )
            for r in csv.DictReader(f)
        ]
    assert [(r.shape, r.precision) for r in rows] == [(s[0], p) for s in SHAPES for p in PRECISIONS]
    text = (folder / "README.md").read_text()
    command, seconds = re.search(r"Command: `([^`]*)` \((\d+) s", text).groups()
    assert render(rows, command, float(seconds)) == text
    assert all(not math.isnan(r.resident_ratio) for r in rows)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--shapes", "3"], "unrecognized arguments: --shapes 3"),
        (["--out", "/proc/posbench"], "--out: cannot write /proc/posbench"),
    ],
)
def test_the_cpu_memory_bench_refuses_bad_flags_in_one_line_before_measuring(argv, words, capsys):
    from harness.bench.cpu_memory import main

    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and words in line
