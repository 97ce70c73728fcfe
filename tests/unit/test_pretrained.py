"""posbench's RoPE scalings on a Hugging Face causal LM's own weights: with the same weights,
the model whose rotary module posbench feeds gives the logits transformers gives through its ``rope_parameters``
(fp32, ≤ 1e-5), per scaling and per model family (Llama; Qwen2; GPT-NeoX with partial rotary; the shipping
families' own settings: tests/unit/test_shipping_rope.py); and the papers'
protocol — one pretrained model, each scaling applied in turn — equals a model configured with that scaling."""

from __future__ import annotations

import pytest
import torch
import transformers

from harness.errors import ConfigError
from harness.pretrained.rotary import ScaledRotary, apply_scaling, rope_parameters, scaling_of

L = 64  # the tiny models' context ("pretrained" length)
R_HALF = {"llama": 8, "qwen2": 8, "gpt_neox": 2}  # R/2: head dim 16 (GPT-NeoX rotary_pct 0.25 → R = 4)


def _longrope(family: str) -> dict:
    n = R_HALF[family]
    return dict(short_factor=[1.0 + 0.1 * i for i in range(n)], long_factor=[1.0 + 0.5 * i for i in range(n)])


SCALINGS = {  # rope_parameters beyond rope_type and rope_theta; max_position_embeddings
    "default": ({}, L),
    "linear": ({"factor": 4.0}, L),
    "dynamic": ({"factor": 2.0}, L),
    "yarn": ({"factor": 4.0, "original_max_position_embeddings": L}, 4 * L),
    "llama3": (
        {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L},
        4 * L,
    ),
    "longrope": ({"factor": 4.0, "original_max_position_embeddings": L}, 4 * L),
}


def tiny(family: str, rope_type: str = "default", seed: int = 0, **extra):
    params, max_pos = SCALINGS[rope_type]
    params = {
        "rope_type": rope_type,
        "rope_theta": 10000.0,
        **params,
        **(_longrope(family) if rope_type == "longrope" else {}),
        **extra,
    }
    common = dict(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=max_pos,
    )
    if family == "gpt_neox":
        params["partial_rotary_factor"] = 0.25
        config = transformers.GPTNeoXConfig(**common, rope_parameters=params)
        cls = transformers.GPTNeoXForCausalLM
    else:
        config = (transformers.LlamaConfig if family == "llama" else transformers.Qwen2Config)(
            **common, num_key_value_heads=2, rope_parameters=params
        )
        cls = transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen2ForCausalLM
    torch.manual_seed(seed)
    return cls(config).eval()


def logits(model, length: int) -> torch.Tensor:
    ids = torch.arange(length)[None] * 7 % 97
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("rope_type", list(SCALINGS))
def test_posbench_rotary_on_the_same_weights_gives_transformers_logits(family, rope_type):
    hf = tiny(family, rope_type)
    ours = tiny(family, "default", seed=1)  # other weights until loaded: the rotary module is all that differs
    ours.load_state_dict(hf.state_dict())
    apply_scaling(ours, scaling_of(hf.config))
    for length in (L // 2, 3 * L):  # inside and beyond the context: dynamic's and longrope's two regimes
        torch.testing.assert_close(logits(ours, length), logits(tiny(family, rope_type), length), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "method,rope_type,factor", [("linear", "linear", 4.0), ("yarn", "yarn", 4.0), ("dynamic_ntk", "dynamic", 2.0)]
)
def test_the_papers_protocol_each_scaling_on_one_pretrained_model(method, rope_type, factor):
    """A model trained at L extended by posbench's scaling equals transformers' model configured with it."""
    base = tiny("llama")
    apply_scaling(base, method=method, factor=factor)
    configured = tiny("llama", rope_type)
    if rope_type == "yarn":  # its original context is the pretrained model's L
        assert configured.config.rope_parameters["original_max_position_embeddings"] == L
    torch.testing.assert_close(logits(base, 3 * L), logits(configured, 3 * L), rtol=0, atol=1e-5)


def test_a_scaled_model_differs_from_the_plain_one_beyond_its_context():
    """The swap is not a no-op: YaRN at 4× changes the logits of a sequence past L."""
    plain, scaled = tiny("llama"), tiny("llama")
    apply_scaling(scaled, method="yarn", factor=4.0)
    assert (logits(plain, 3 * L) - logits(scaled, 3 * L)).abs().max() > 1e-3


def test_a_model_without_rope_is_refused_and_per_layer_type_parameters_are_read_per_type():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ConfigError, match="has no rotary_emb module"):
        apply_scaling(gpt2, scaling_of(tiny("llama").config))
    config = tiny("llama").config
    config.rope_parameters = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e6},
    }
    assert rope_parameters(config, "sliding_attention")["rope_theta"] == 1e6
    with pytest.raises(ConfigError, match="hold no RoPE for layer type 'chunked_attention'"):
        rope_parameters(config, "chunked_attention")


@pytest.mark.parametrize("options", [{"resonance": True}, {"hope": True}, {"resonance": True, "hope": True}])
def test_posbenchs_own_theta_beyond_transformers_reaches_the_pretrained_model(options):
    """Resonance RoPE's and HoPE's θ, as posbench's RoPE scheme computes them for a model trained at L, written into
    transformers' own rotary module, give the logits posbench's swap gives (schemes beyond HF's)."""
    from positional.base import Shape
    from positional.rope import Rope

    hf, ours = tiny("llama"), tiny("llama")
    theta = Rope(Shape(64, 4, 2, L, True), **options).frequencies_at(16)  # the tiny Llama: head dim 16; HoPE at L
    assert not torch.equal(theta, Rope(Shape(64, 4, 2, L, True)).frequencies_at(16))  # it is another θ
    hf.model.rotary_emb.inv_freq.copy_(theta.float())
    apply_scaling(ours, method="none", **options)
    for length in (L // 2, 3 * L):
        torch.testing.assert_close(logits(ours, length), logits(hf, length), rtol=0, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"resonance": True}, {"hope": True}, {"resonance": True, "hope": True}])
def test_posbenchs_rope_and_the_pretrained_rotary_turn_by_the_same_angles(options):
    """fp64, bit for bit: pos=rope trained at L and the rotary swapped into a pretrained model of context L (HoPE at
    L) give the same cos and sin at every position, with and without Resonance and HoPE."""
    from positional.base import Shape
    from positional.rope import Rope
    from positional.rope_scaling import RopeScaling

    positions = torch.arange(3 * L)
    ours = Rope(Shape(64, 4, 2, L, True), **options).eval().rotary(positions)  # head dim 16: R/2 = 8 angles
    hope = L if options.get("hope") else None
    rotary = ScaledRotary({None: RopeScaling(base=10000.0, rotated=16)}, "half", options.get("resonance", False), hope)
    cos, sin = rotary(torch.zeros(1, 1, 1, dtype=torch.float64), positions[None])  # (1, T, R/2) each
    assert torch.equal(cos[0], ours.cos) and torch.equal(sin[0], ours.sin)
