"""The scale=paper presets (conf/experiment/*/scale/paper.yaml, enumerated): each passes ``--check`` for a GPU of
a named size (80 GB by default) with its memory estimate; the estimate against a hand computation and, in
fp32, against the meta rehearsal of the real model; and three optimizer steps of each preset on this CPU with
its model and batch shrunk (2 sequences) but its corpus, sequence length, tokenizer, objective and precision as the
preset has them.

Data: a preset reads the corpus its defaults name (data=embedded, the corpus shipped in the package, for
every preset here); the presets that say "pass data=text data.path=..." or "data=enwik8" want a corpus that
is not available offline, so their data is tested as the embedded corpus stands in for it — on purpose, as a
user would say so: ``~paper`` (the paper's vocabulary not required) and ``budget.max_epochs=null`` (a 2 MB
corpus read thousands of times). Without them every paper preset is refused in one line (tested below).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from harness.config.check import check
from harness.config.estimates import PRECISIONS, NamedGpu, SchemeTerms, gib, gpu_estimate
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig
from tests.paper_presets import GPU, PAPER, _cells, _composed, _first_cell


@functools.cache
def _roformer_mlm():
    """roformer_mlm's paper cell pos=rope seed=0, the stand-ins on purpose: loaded once for the tests that check it
    (a RunSpec is frozen, and check reads it)."""
    return _composed(["experiment=roformer_mlm", "scale=paper", "pos=rope", "seed=0"])


# a text preset whose paper scale reads the embedded corpus few enough times to pass (4.4 passes over its 1.9M
# training tokens); every other text preset reads it more than budget.max_epochs=100 times
FITS_THE_EMBEDDED_CORPUS = {"tune_lr"}


def on_the_embedded_corpus(preset: str, spec) -> str:
    """What a paper preset's first cell gets on the embedded corpus with the byte vocabulary, from its own config:
    the paper's vocabulary asked for (``paper``: a preset that states one), no epochs to count (``ok``: a synthetic
    task draws fresh examples), or too many passes over the corpus (``epochs``)."""
    if (spec.run.paper or {}).get("vocab_size"):
        return "paper"
    synthetic = spec.task.target.__module__.startswith("harness.data.tasks.")
    return "ok" if synthetic or preset in FITS_THE_EMBEDDED_CORPUS else "epochs"


@pytest.mark.parametrize("preset", PAPER)
def test_every_paper_preset_on_the_embedded_corpus_is_refused_with_the_fix(preset):
    """scale=paper on the embedded corpus and a byte vocabulary is refused in one line naming the fix (``~paper``
    for a substitute of the paper's model, ``budget.max_epochs=null`` for a corpus read past the epoch cap), or
    checked with a budget where the preset fits."""
    spec = _composed([f"experiment={preset}", "scale=paper", *_cells(preset)[0]], stand_in=False)
    expected = on_the_embedded_corpus(preset, spec)
    if expected == "ok":
        assert check(spec, GPU).budget.tokens > 0
        return
    with pytest.raises(ConfigError) as e:
        check(spec, GPU)
    said = str(e.value)
    if expected == "paper":
        assert said.startswith("this scale=paper setting is the paper's model on ") and said.endswith(
            "or ~paper to train this substitute on purpose"
        )
    else:
        assert "beyond budget.max_epochs=100" in said and said.endswith("budget.max_epochs=null to train it anyway")


def test_check_prints_the_budget_and_the_run_beside_the_paper(capsys):
    from harness.cli import check_command

    spec = _composed(
        ["experiment=eleuther_rotary", "scale=paper", "pos=rope", "seed=0", "budget.max_epochs=null"], stand_in=False
    )
    with pytest.raises(ConfigError, match=r"GPT-2's BPE \(50,257 tokens\); this tokenizer's 258 make it 85.8M"):
        check(spec, GPU)
    assert (
        check_command(
            ["experiment=eleuther_rotary", "scale=paper", "pos=rope", "seed=0", "~paper", "budget.max_epochs=null"],
            [],
            False,
            GPU,
        )
        == 0
    )
    line = capsys.readouterr().out
    # 55,000 steps × 32 × 2048 tokens × 8 accumulated (GPT-3 Small's 0.5M); 6·N + 6·L·T·C FLOPs a token; hours at
    # 989 TFLOP/s × 0.4
    tokens = 55_000 * 32 * 2048 * 8
    n = 12 * (4 * 768**2 + 2 * 768 * 3072) + 768 * 258
    flops = tokens * (6 * n + 6 * 12 * 2048 * 768)
    assert (
        " · 55000 steps of 32×2048 tokens × 8 accumulated · 28.8B tokens (15,312.2 epochs) · "
        f"{flops:.1e} FLOPs ≈ {flops / (989e12 * 0.4) / 3600:,.1f} GPU-hours" in line
    )


@pytest.mark.parametrize("devices", [[0, 1, 2, 3], "0,1,2,3", "4"])
def test_the_budget_counts_every_device_however_devices_is_written(devices):
    """trainer.devices as a list of ids or a string counts as many ranks as the count does: a step's tokens, and so
    the epochs ``budget.max_epochs`` holds a run to, are the same as with ``trainer.devices=4``."""
    from dataclasses import replace

    from harness.config.estimates import budget_of

    spec = _composed(["experiment=eleuther_rotary", "scale=paper", "pos=rope", "seed=0"])
    task = SimpleNamespace(sequence_tokens=lambda length: length, scores_sequences=False)

    def tokens(trainer):
        return budget_of(spec.budget, trainer, spec.data, task, spec.model, 258, 1, None, None).tokens

    assert tokens(replace(spec.trainer, devices=devices)) == tokens(replace(spec.trainer, devices=4))
    assert tokens(replace(spec.trainer, devices=4)) == 4 * tokens(replace(spec.trainer, devices=1))


def test_the_1b4_setting_is_the_blogs_pile_model_at_gpt3_xls_batch():
    """eleuther_rotary scale=paper_1b4: with GPT-2's 50,257 ids the model is the blog's 1.4B (1.41B), a step
    is GPT-3 XL's 1M tokens (64 accumulated batches of 8 × 2,048), and one batch fits an 80 GB GPU."""
    spec = _composed(["experiment=eleuther_rotary", "scale=paper_1b4", "pos=rope", "seed=0"], stand_in=False)
    paper = spec.run.paper
    assert paper is not None
    vocab = int(paper["vocab_size"])
    assert (paper["data"], vocab) == ("the Pile", 50257)
    model = _built_with(spec, vocab)
    assert 1.41e9 < model.num_params() < 1.42e9  # 1,414,455,296: the blog rounds to 1.4B
    step = spec.data.batch_size * spec.data.seq_len * spec.trainer.accumulate_grad_batches
    assert step == 1_048_576 and abs(step / paper["batch_tokens"] - 1) < 0.05
    est = gpu_estimate(
        "x",
        "y",
        model.num_params(),
        spec.model,
        vocab,
        spec.data.batch_size,
        spec.data.seq_len,
        spec.trainer.precision,
        SchemeTerms.of(model.pos),
    )
    assert est.total <= GPU.memory and est.logits == 8192 * vocab * (2 + 4 + 4 + 4)  # model.loss_chunk=8192


def _built_with(spec, vocab: int):
    from harness.model.transformer import Transformer

    with torch.device("meta"):
        return Transformer(spec.model, vocab, spec.data.seq_len, True, pos=spec.pos.factory(), attn=spec.attn.factory())


def test_the_paper_presets_are_enumerated():
    assert {"roformer_mlm", "alibi_extrapolation", "eleuther_rotary", "rope_scaling"} <= set(PAPER)


@pytest.mark.parametrize("preset", PAPER)
def test_every_paper_preset_passes_check_for_an_80gb_gpu(preset):
    cell, checked = _first_cell(preset)
    if checked.spec.trainer.accelerator not in ("gpu", "cuda"):  # tune_lr's paper scale sets no GPU: a CPU check
        assert checked.gpu is None
        return
    assert checked.gpu is not None, "a GPU run checked for a named GPU carries its estimate"
    est = checked.gpu
    assert 0 < est.total <= GPU.memory
    assert est.states >= 16 * checked.n_params  # fp32 weights, gradients and AdamW's two moments at least
    assert est.tokens == (checked.spec.data.batch_size, checked.task.sequence_tokens(checked.spec.data.seq_len))


def test_the_estimate_equals_a_hand_computation():
    """roformer_mlm at paper scale, pos=rope: BERT-base's shape (12 layers, C = 768, F = 3072, H = 12), the byte
    tokenizer's V = 258, 64 × 512 tokens, bf16-mixed, dropout 0.1, post-norm, the loss's logits 8,192 tokens at a
    time (model.loss_chunk)."""
    checked = check(_roformer_mlm(), GPU)
    C, F, H, L, V = 768, 3072, 12, 12, 258
    block = (3 * C * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C) + 2 * 2 * C  # qkv, out, MLP, 2 LayerNorms
    head = V * C + (C * C + C) + 2 * C + V  # tied embedding, dense, LayerNorm, decoder bias (post-norm: no norm_f)
    params = L * block + head
    assert checked.n_params == params == 85_844_994
    states = params * (4 + 4 + 2 * 4 + 2)  # fp32 weight, gradient, two AdamW moments; bf16 copy for the products
    a, r = 2, 4  # bf16 activations, fp32 residual stream
    per_layer = (
        2 * r * C  # the two LayerNorms' inputs
        + 2 * a * C  # their outputs as the projections take them
        + 3 * a * C  # q, k, v
        + 2 * a * C  # q, k rotated
        + 2 * a * C  # attention output and its copy
        + 2 * a * F  # MLP hidden before and after GELU
        + 4 * H  # log-sum-exp
        + 2 * C
    )  # two dropout masks
    assert per_layer == 33_840
    tokens = 64 * 512
    activations = tokens * (L * per_layer + 2 * r * C + 3 * a * C)
    logits = 8192 * V * (a + 4 + 4 + 4)  # one chunk's bf16 logits, their fp32 copy, log-softmax, its fp32 gradient
    est = checked.gpu
    assert (est.states, est.activations, est.logits) == (states, activations, logits)
    assert est.total == 15_233_550_372
    assert gib(est.total) == "14.2 GiB"


def test_the_modern_block_estimate_equals_a_hand_computation():
    """The Llama/Qwen3 block (model=modern: RMSNorm, SwiGLU, no biases, an untied head after the final norm) at
    d512 × 4, fp32 and bf16-mixed: the terms the GELU block's hand computation has, with RMSNorm's normalised input
    kept beside its input (fp32 under autocast) and SwiGLU's four F-wide tensors (gate|up, SiLU(gate), product)."""
    model = ModelConfig(
        n_layers=4,
        d_model=512,
        n_heads=8,
        d_ff=344,
        dropout=0.0,
        norm_type="rmsnorm",
        mlp="swiglu",
        bias=False,
        head="untied",
    )
    C, F, H, L, V, tokens = 512, 344, 8, 4, 258, 8 * 512
    for precision, a in (("32-true", 4), ("bf16-mixed", 2)):
        r = 4
        per_layer = (
            2 * 2 * r * C  # the two RMSNorms' inputs and normalised inputs
            + 2 * a * C  # their outputs as the projections take them
            + 3 * a * C  # q, k, v
            + 2 * a * C  # q, k rotated
            + 2 * a * C  # attention output and its copy
            + 4 * a * F  # gate|up, SiLU(gate), their product
            + 4 * H
        )  # log-sum-exp
        head = 2 * r * C + a * C  # the final RMSNorm's input and normalised input, the decoder's input
        est = gpu_estimate("x", "y", 1000, model, V, 8, 512, precision, SchemeTerms(rotary=True))
        assert est.activations == tokens * (L * per_layer + head), precision


def test_a_learned_bias_adds_its_tables_and_the_kernels_gradient():
    """T5's bias: the dense (1, H, T, T) fp32 table once (shared by the layers), each layer's additive mask in
    bf16, and the gradient the kernel writes for every batch row, one layer at a time."""
    model = ModelConfig(d_model=64, d_ff=256, n_heads=4, n_layers=2, dropout=0.0)
    plain = gpu_estimate("x", "y", 1000, model, 100, 8, 32, "bf16-mixed")
    t5 = gpu_estimate("x", "y", 1000, model, 100, 8, 32, "bf16-mixed", SchemeTerms(bias="learned"))
    alibi = gpu_estimate("x", "y", 1000, model, 100, 8, 32, "bf16-mixed", SchemeTerms(bias="fixed"))
    pairs = 4 * 32 * 32
    assert t5.activations - plain.activations == 4 * pairs + 2 * pairs * 2 + 2 * 8 * pairs
    assert alibi.activations - plain.activations == 4 * pairs + 2 * pairs * 2
    per_layer = gpu_estimate(
        "x", "y", 1000, model, 100, 8, 32, "bf16-mixed", SchemeTerms(bias="fixed", bias_per_layer=True)
    )
    assert per_layer.activations - alibi.activations == 4 * pairs  # a second layer's own table


def test_a_variant_adds_what_a_layer_of_it_keeps_beyond_softmax():
    """Performer's random features (roformer_performer at paper scale) are measured on meta tensors and added at
    bf16's width; softmax in its fused kernel adds nothing."""
    from harness.config.resources import model_of, variant_bytes_per_layer

    def on_meta(checked):
        with torch.device("meta"):
            spec, task = checked.spec, checked.task
            return model_of(spec, checked.tokenizer.vocab_size, task.sequence_tokens(spec.data.seq_len), task.causal)

    checked = check(_composed(["experiment=roformer_performer", "scale=paper", "pos=rope", "seed=0"]), GPU)
    extra = variant_bytes_per_layer(checked.spec, on_meta(checked), checked.task)
    assert extra > 0
    spec = checked.spec
    plain = gpu_estimate("x", "y", checked.n_params, spec.model, 258, 64, 1024, "bf16-mixed", SchemeTerms(True))
    assert checked.gpu.activations == plain.activations + 12 * extra * 2 // 4
    assert checked.gpu.total <= GPU.memory  # 64 a pass, 2 accumulated: the paper's 128 (its scale file)
    assert spec.trainer.accumulate_grad_batches * spec.data.batch_size == 128
    checked = check(_roformer_mlm(), GPU)
    assert variant_bytes_per_layer(checked.spec, on_meta(checked), checked.task) == 0


@pytest.mark.parametrize("pos,dropout", [("rope", 0.0), ("none", 0.1)])
def test_the_fp32_estimate_agrees_with_the_meta_rehearsal(pos, dropout):
    """In fp32 the formula counts what the real model keeps: the rehearsal (harness/config/rehearsal.py) runs
    the model's own forward and backward on meta tensors and adds up every storage; the two agree within
    15 % where the formula's assumption holds (softmax attention in a fused kernel, no T×T bias)."""
    from harness.config.rehearsal import rehearse

    B, T = 4, 256
    spec = _composed(
        [
            f"pos={pos}",
            "model.n_layers=2",
            "model.d_model=128",
            "model.n_heads=4",
            "model.d_ff=512",
            f"model.dropout={dropout}",
            f"data.seq_len={T}",
            "task=clm",
        ]
    )
    model_cfg = spec.model
    model = _built_with(spec, 258)
    measured = rehearse(model, spec.values, B, T, [], None)[0].needs
    est = gpu_estimate("x", "y", model.num_params(), model_cfg, 258, B, T, "32-true", SchemeTerms.of(model.pos))
    assert 0.85 <= est.total / measured <= 1.15, f"formula {est.total:,} vs rehearsal {measured:,}"


def test_every_precision_lightning_accepts_has_an_estimate():
    from harness.config import spec

    assert {str(p) for p in spec.PRECISIONS.__args__} == set(PRECISIONS)


@pytest.mark.parametrize(
    "text,bytes_",
    [
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        ("40gb", 40 * 10**9),
        ("0.5MB", 500_000),
        ("1.5TiB", int(1.5 * 2**40)),
    ],
)
def test_gpu_sizes_parse(text, bytes_):
    assert NamedGpu.parse(text).memory == bytes_


@pytest.mark.parametrize("text", ["80", "GB", "-1GB", "0GB", "eightyGB", "80PB", "nanGB", "infGB"])
def test_a_size_without_a_unit_or_a_positive_number_is_refused(text):
    with pytest.raises(ConfigError, match=r"--gpu-memory=.* is not a memory size; give a number and a unit"):
        NamedGpu.parse(text)


def test_check_prints_the_estimate_and_that_it_fits(capsys):
    from harness.cli import ok_line

    print(ok_line(check(_roformer_mlm(), GPU), "", GPU))
    line = capsys.readouterr().out.strip()
    assert line.startswith("ok: pos=rope attn=softmax task=mlm")
    assert line.endswith(
        "GPU of 80GB (74.5 GiB): a training step needs about 14.2 GiB (1.4 GiB weights, gradients "
        "and AdamW state, 12.7 GiB activations and 0.0 GiB logits for 64×512 tokens (8192 at a "
        "time)), fits"
    )


def test_a_step_that_does_not_fit_is_refused_with_its_figure():
    """Refused with the built model's estimate; a GPU even the blocks alone overflow, before the model is laid out
    (a huge one takes long even on meta), with that lower bound."""
    spec = _roformer_mlm()
    with pytest.raises(ConfigError) as e:
        check(spec, NamedGpu.parse("14GiB"))
    assert str(e.value) == (
        "on a GPU of 14GiB (14.0 GiB) a training step does not fit: it needs about 14.2 GiB (1.4 "
        "GiB weights, gradients and AdamW state, 12.7 GiB activations and 0.0 GiB logits for "
        "64×512 tokens (8192 at a time)); lower data.batch_size=64 or data.seq_len=512, or name a "
        "larger GPU with --gpu-memory"
    )
    with pytest.raises(
        ConfigError,
        match=r"on a GPU of 8GiB \(8.0 GiB\) a training step does not fit: it needs at "
        r"least 13.1 GiB",
    ):
        check(spec, NamedGpu.parse("8GiB"))


# ---------------------------------------------------------------- three optimizer steps on this CPU


# ---------------------------------------------------------------- the dress rehearsal


def test_check_of_a_sweep_ends_with_what_the_whole_sweep_costs(monkeypatch, capsys):
    """`--check -m`: each cell's line gives its own budget, and a last line sums them (for the
    cell and for the sweep); GPU-hours only where every cell has them (a CPU cell has none)."""
    from types import SimpleNamespace

    from harness import cli
    from harness.config.estimates import Budget

    def sweep_line(budgets: list[Budget], seeds: str = "fixed") -> str:
        """The last line `--check -m` prints for a sweep whose cells check with these budgets."""
        report = SimpleNamespace(report=SimpleNamespace(seeds=seeds, max_seeds=10))
        checked = iter([SimpleNamespace(budget=b, spec=report) for b in budgets])
        monkeypatch.setattr(cli, "cells", lambda overrides, dirs: [[f"seed={i}"] for i in range(len(budgets))])
        monkeypatch.setattr(cli, "load", lambda cell, dirs, multirun: cell)
        monkeypatch.setattr(cli, "check", lambda spec, gpu: next(checked))
        monkeypatch.setattr(cli, "ok_line", lambda checked, cell, gpu: f"ok: {cell}")
        assert cli.check_command([], [], True, None) == 0
        return capsys.readouterr().out.splitlines()[-1]

    cell = Budget(tokens=28_835_840_000, train_tokens=None, flops=1.8e19, gpu_hours=12.6)
    assert sweep_line([cell] * 9) == "sweep: 9 cells · 259.5B tokens · 1.6e+20 FLOPs ≈ 113.4 GPU-hours"
    cpu = Budget(tokens=1000, train_tokens=None, flops=2e9, gpu_hours=None)
    assert sweep_line([cell, cpu]) == "sweep: 2 cells · 28.8B tokens · 1.8e+19 FLOPs"
    # report.seeds=auto: the worst case, every cell trained to report.max_seeds
    worst = (
        "sweep: 9 cells × up to 10 seeds (report.seeds=auto), at most · 2.6T tokens · 1.6e+21 FLOPs ≈ 1,134.0 GPU-hours"
    )
    assert sweep_line([cell] * 9, "auto") == worst
