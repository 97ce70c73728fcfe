"""export=hf: a posbench model written in transformers' format loads with AutoModelForCausalLM and gives the same
logits (Llama for the modern block, Qwen3 with QK-norm; RoPE's interleaved layout permuted into the half one);
what has no such form is refused before training; a run's hf_model/ artifacts load from MLflow."""

from __future__ import annotations

import re

import pytest
import torch

from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from harness.pretrained.export import half_order, hf_files, refusal
from positional.rope import Rope

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V, T = 61, 16
MODERN = dict(
    n_layers=2,
    d_model=32,
    n_heads=4,
    d_ff=48,
    dropout=0.0,
    norm_type="rmsnorm",
    mlp="swiglu",
    bias=False,
    head="untied",
)


def ours(layout="interleaved", **kw) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(**{**MODERN, **kw}), V, T, True, lambda s: Rope(s, base=500.0, layout=layout), Softmax
    ).eval()
    with torch.no_grad():  # norms off 1, so that a norm written to the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def loaded(model, tmp_path):
    for name, content in hf_files(model, V, T, causal=True).items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tmp_path).eval()


@pytest.mark.parametrize(
    "layout, kw, arch",
    [
        ("interleaved", {}, "LlamaForCausalLM"),
        ("half", {}, "LlamaForCausalLM"),
        ("interleaved", {"qk_norm": True}, "Qwen3ForCausalLM"),
        ("half", {"head": "tied"}, "LlamaForCausalLM"),
    ],
)
def test_an_exported_model_loads_with_transformers_and_gives_the_same_logits(tmp_path, layout, kw, arch):
    model = ours(layout, **kw)
    hf = loaded(model, tmp_path)
    assert type(hf).__name__ == arch
    ids = torch.randint(V, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=1e-5, atol=1e-5)


def test_the_interleaved_layout_is_the_half_one_after_permuting_each_heads_dims():
    """q·k of the two layouts agree when q and k are permuted evens-then-odds: pairs (x_2i, x_2i+1) become
    (x_i, x_i+D/2), rotated by the same angle."""
    from positional.base import Shape

    shape = Shape(8, 1, 1, T, True)
    inter, half = Rope(shape), Rope(shape, layout="half")
    q, k = torch.randn(1, 1, T, 8, dtype=torch.float64), torch.randn(1, 1, T, 8, dtype=torch.float64)
    pos = torch.arange(T)
    a, b = inter.rotaries(pos, 1)[0], half.rotaries(pos, 1)[0]
    order = half_order(8)
    torch.testing.assert_close(b.rotate_q(q[..., order]), a.rotate_q(q)[..., order], rtol=0, atol=1e-12)
    torch.testing.assert_close(b.rotate_k(k[..., order]), a.rotate_k(k)[..., order], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "kw, causal, needle",
    [
        ({"norm_type": "layernorm"}, True, "model.norm_type=layernorm: transformers' Llama has the modern block"),
        ({"head": "bert"}, True, "model.head=bert"),
        ({"norm": "post"}, True, "model.norm=post"),
        ({"temperature": "ssmax"}, True, "model.temperature=ssmax has no key in LlamaConfig"),
        ({}, False, "a bidirectional task"),
    ],
)
def test_what_llama_cannot_hold_is_refused_naming_it(kw, causal, needle):
    model = Transformer(ModelConfig(**{**MODERN, **kw}), V, T, causal, Rope, Softmax)
    assert needle in refusal(model, causal)
    with pytest.raises(ConfigError, match=re.escape(f"export=hf: {needle}")):
        hf_files(model, V, T, causal)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["pos=alibi"], "pos=alibi: LlamaForCausalLM applies RoPE"),
        (["attn=local"], "attn=local: Llama's attention is full softmax attention"),
        (["pos.fraction=0.5"], "pos.fraction=0.5"),
        (["+pos.layers=[rope,none]"], "a per-layer pattern"),
        (["phases=[{at:3,pos:none}]"], "pos=none: LlamaForCausalLM applies RoPE"),  # judged on the scheme it ends with
        (["model=small"], "model.norm_type=layernorm"),
        (["pos/scaling=yarn", "pos.scaling.factor=4"], "pos.scaling=yarn: the export writes plain RoPE"),
        (["pos/scaling=dynamic_ntk"], "pos.scaling=dynamic_ntk: the export writes plain RoPE"),
    ],
)
def test_a_run_asked_to_export_what_has_no_form_is_refused_before_training(overrides, needle):
    from tests.helpers import validated

    with pytest.raises(ConfigError, match=re.escape(f"export=hf: {needle}")):
        validated("model=modern", "task=clm", "export=hf", *overrides)
