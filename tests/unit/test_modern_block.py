"""The modern block (model=modern: RMSNorm, SwiGLU, no biases, untied head, QK-norm) and the length-scaled
attention temperature (model.temperature): parity with transformers' Llama, Qwen3 and Llama 4 in fp64, the
formulas by hand, and a run of each read back from MLflow."""

from __future__ import annotations

import math

import pytest
import torch

from attention.base import AttentionContext
from attention.local import Local
from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.temperature import llama4_factor, ssmax_factor
from harness.model.transformer import Attention, ModelConfig, Transformer
from positional.none import NoPosition
from positional.rope import Rope

transformers = pytest.importorskip("transformers")

C, H, FF, V, T = 32, 4, 48, 61, 12
MODERN = dict(norm_type="rmsnorm", mlp="swiglu", bias=False, head="untied", dropout=0.0)


def ours(causal=True, pos=None, **kw) -> Transformer:
    cfg = ModelConfig(n_layers=2, d_model=C, n_heads=H, d_ff=FF, **{**MODERN, **kw})
    pos = pos or (lambda shape: Rope(shape, layout="half"))
    return Transformer(cfg, V, T, causal, pos, Softmax).double().eval()


def copy_into_hf(model: Transformer, hf) -> None:
    """Our weights into a transformers decoder-only model of the same shape (names as Llama's and Qwen3's)."""
    inner = hf.model
    with torch.no_grad():
        inner.embed_tokens.weight.copy_(model.tok_emb.weight)
        for block, layer in zip(model.blocks, inner.layers, strict=True):
            q, k, v = block.attn.qkv.weight.split(C)
            layer.self_attn.q_proj.weight.copy_(q)
            layer.self_attn.k_proj.weight.copy_(k)
            layer.self_attn.v_proj.weight.copy_(v)
            layer.self_attn.o_proj.weight.copy_(block.attn.out.weight)
            gate, up = block.ff.gate_up.weight.split(FF)
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(block.ff.down.weight)
            layer.input_layernorm.weight.copy_(block.norm1.weight)
            layer.post_attention_layernorm.weight.copy_(block.norm2.weight)
            if hasattr(layer.self_attn, "q_norm"):
                layer.self_attn.q_norm.weight.copy_(block.attn.q_norm.weight)
                layer.self_attn.k_norm.weight.copy_(block.attn.k_norm.weight)
        inner.norm.weight.copy_(model.norm_f.weight)
        hf.lm_head.weight.copy_(model.decoder.weight)


def hf_config(cls, **kw):
    return cls(
        vocab_size=V,
        hidden_size=C,
        intermediate_size=FF,
        num_hidden_layers=2,
        num_attention_heads=H,
        num_key_value_heads=H,
        head_dim=C // H,
        max_position_embeddings=T,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        **kw,
    )


def randomized(model: Transformer) -> Transformer:
    """Norm weights off 1 so that a norm copied to the wrong place shows."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_modern_block_is_llama_and_qwen3_to_fp64_precision(family):
    """model=modern with pos.layout=half is LlamaForCausalLM; with model.qk_norm=true it is Qwen3ForCausalLM
    (QK-norm per head before the rotation): the same weights give the same logits in fp64 within 1e-6 — transformers
    computes RoPE's angles in fp32 whatever the model's dtype (``inv_freq.float() @ position_ids.float()``)."""
    torch.manual_seed(0)
    qk = family == "qwen3"
    model = randomized(ours(qk_norm=qk))
    if qk:
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model
    else:
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model
    hf = Model(hf_config(Config, attn_implementation="eager")).double().eval()
    copy_into_hf(model, hf)
    ids = torch.randint(V, (2, T))
    torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-6)


def test_swiglu_is_silu_gate_times_up_then_down_by_hand():
    torch.manual_seed(0)
    model = ours()
    ff, x = model.blocks[0].ff, torch.randn(3, C, dtype=torch.float64)
    w = ff.gate_up.weight
    expected = ((x @ w[:FF].T) * torch.sigmoid(x @ w[:FF].T) * (x @ w[FF:].T)) @ ff.down.weight.T
    torch.testing.assert_close(ff(x), expected, rtol=0, atol=1e-12)


def test_no_bias_anywhere_and_an_untied_head():
    model = ours()
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if n.endswith("bias")], names
    assert model.decoder.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    tied = ours(head="tied")
    assert tied.decoder is None and tied.head_bias is None
    assert tied.num_params() == model.num_params() - V * C  # the untied head is V·C weights of its own


def test_the_classic_block_is_unchanged_by_the_new_keys():
    """The defaults build today's block: LayerNorm with biases, GELU MLP, BERT's head tied to the embedding."""
    cfg = ModelConfig(n_layers=2, d_model=C, n_heads=H, d_ff=FF)
    model = Transformer(cfg, V, T, False, Rope, Softmax)
    assert isinstance(model.blocks[0].norm1, torch.nn.LayerNorm) and model.blocks[0].norm1.bias is not None
    assert isinstance(model.blocks[0].ff[1], torch.nn.GELU)
    assert model.decoder is None and model.head_bias is not None
    per_layer = 4 * C * C + 4 * C + 2 * C * FF + FF + C + 4 * C  # attention, MLP, two LayerNorms
    assert model.num_params() == 2 * per_layer + V * C + 2 * C + C * C + 3 * C + V  # embedding, final LN, BERT head


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"mlp": "relu"}, "model.mlp='relu'"),
        ({"norm_type": "batchnorm"}, "model.norm_type"),
        ({"head": "shared"}, "model.head"),
        ({"qk_norm": "yes"}, "model.qk_norm"),
        ({"temperature": "yarn"}, "model.temperature"),
        ({"temperature_floor": 0}, "model.temperature_floor"),
    ],
)
def test_a_bad_block_key_is_refused_naming_it(bad, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**bad)


# ---------------------------------------------------------------- length-scaled temperature


def test_ssmax_keeps_the_largest_weight_near_one_where_softmax_fades():
    """Nakanishi 2025, Fig. 1: logits −2 everywhere but +3 at one place; softmax's largest weight falls towards
    0 as n grows, SSMax's (s = 0.43) stays near 1."""
    s = torch.tensor([0.43], dtype=torch.float64)
    for n in (10, 100, 1000, 10_000):
        z = torch.full((n,), -2.0, dtype=torch.float64)
        z[-1] = 3.0
        plain = torch.softmax(z, 0)[-1].item()
        scaled = torch.softmax(ssmax_factor(s, torch.tensor([n]))[0, 0, 0] * z, 0)[-1].item()
        assert scaled == pytest.approx(n ** (0.43 * 3) / (n ** (0.43 * 3) + (n - 1) * n ** (-0.43 * 2)), rel=1e-12)
        if n >= 1000:
            assert plain < 0.2 and scaled > 0.85
    got = ssmax_factor(torch.tensor([0.5, 2.0], dtype=torch.float64), torch.tensor([1, 8])).squeeze(-1)
    torch.testing.assert_close(
        got, torch.tensor([[0.0, 0.5 * math.log(8)], [0.0, 2 * math.log(8)]], dtype=torch.float64), rtol=0, atol=1e-15
    )


def test_llama4_temperature_by_hand():
    """τ_i = 1 + β·log(1 + ⌊(i + 1)/F⌋): 1 below F, then steps at every multiple of F."""
    got = llama4_factor(9, floor=4, scale=0.1, dtype=torch.float64)[:, 0].tolist()
    want = [
        1,
        1,
        1,
        1 + 0.1 * math.log(2),
        1 + 0.1 * math.log(2),
        1 + 0.1 * math.log(2),
        1 + 0.1 * math.log(2),
        1 + 0.1 * math.log(3),
        1 + 0.1 * math.log(3),
    ]
    assert got == pytest.approx(want, rel=1e-15)


def test_llama4_temperature_matches_transformers_nope_attention():
    """A NoPE layer of transformers' Llama4TextAttention with attn_temperature_tuning and ours with
    model.temperature=llama4 give the same output for the same weights (floor 4 so that 12 positions step), in fp64
    within 1e-9: transformers computes τ in fp32 (``positions.float()``)."""
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    torch.manual_seed(0)
    config = Llama4TextConfig(
        hidden_size=C,
        num_attention_heads=H,
        num_key_value_heads=H,
        head_dim=C // H,
        num_hidden_layers=1,
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.1,
        use_qk_norm=False,
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    theirs = Llama4TextAttention(config, 0).double().eval()
    cfg = ModelConfig(
        n_layers=1,
        d_model=C,
        n_heads=H,
        d_ff=FF,
        bias=False,
        temperature="llama4",
        temperature_floor=4,
        temperature_scale=0.1,
    )
    model = Transformer(cfg, V, T, True, NoPosition, Softmax).double().eval()
    mine = model.blocks[0].attn
    with torch.no_grad():
        q, k, v = mine.qkv.weight.split(C)
        for proj, w in ((theirs.q_proj, q), (theirs.k_proj, k), (theirs.v_proj, v), (theirs.o_proj, mine.out.weight)):
            proj.weight.copy_(w)
    x = torch.randn(2, T, C, dtype=torch.float64)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    want = theirs(x, None, mask)[0]
    torch.testing.assert_close(mine(x, AttentionContext(causal=True)), want, rtol=0, atol=1e-9)
    plain = Attention(ModelConfig(n_layers=1, d_model=C, n_heads=H, d_ff=FF, bias=False), mine.variant).double()
    plain.load_state_dict(mine.state_dict())
    assert not torch.allclose(plain(x, AttentionContext(causal=True)), want)  # the temperature is what matched


def test_ssmax_scales_each_query_by_s_log_keys_attended():
    """The variant receives τ_i·q_i with τ_i = s_h·log n_i: n_i = i + 1 under a causal mask."""
    torch.manual_seed(0)
    model = ours(temperature="ssmax", temperature_init=0.7)
    seen = []
    model.blocks[0].attn.variant.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    plain = ours(temperature="none")
    plain.load_state_dict(model.state_dict(), strict=False)
    plain.blocks[0].attn.variant.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    ids = torch.randint(V, (2, T))
    model(ids), plain(ids)
    s = model.blocks[0].attn.temperature.s.detach()  # 0.7 as fp32 holds it, then fp64
    assert s.tolist() == pytest.approx([0.7] * H, rel=1e-7)
    tau = s[:, None, None] * torch.log(torch.arange(1, T + 1, dtype=torch.float64))[:, None]  # (H, T, 1)
    torch.testing.assert_close(seen[0], seen[1] * tau, rtol=0, atol=1e-12)
    assert ours(temperature="ssmax").blocks[0].attn.temperature.s.tolist() == pytest.approx([1 / math.log(T)] * H)


def test_keys_attended_counts_the_window_and_the_padding():
    ctx, shape = AttentionContext(causal=True), ours().blocks[0].attn.variant.shape
    assert Softmax(shape).keys_attended(5, ctx).tolist() == [1, 2, 3, 4, 5]
    assert Local(shape, window=3).keys_attended(5, ctx).tolist() == [1, 2, 3, 3, 3]
    both = AttentionContext(causal=False)
    assert Softmax(shape).keys_attended(5, both).tolist() == [5] * 5
    assert Local(shape, window=3).keys_attended(5, both).tolist() == [2, 3, 3, 3, 2]
    pad = AttentionContext(key_padding_mask=torch.tensor([[True] * 5, [True, True, True, False, False]]))
    assert Softmax(shape).keys_attended(5, pad).squeeze(1).tolist() == [[5] * 5, [3] * 5]
    assert Local(shape, window=3).keys_attended(5, pad).squeeze(1).tolist() == [[2, 3, 3, 3, 2], [2, 3, 2, 1, 1]]


def test_temperature_on_nope_layers_only():
    """temperature_layers=nope: Llama 4 puts it on the layers without RoPE only."""
    from harness.model.layers import LayerPattern

    pattern = LayerPattern("pos.layers", ("rope", "none"), {"rope": Rope, "none": NoPosition})
    cfg = ModelConfig(n_layers=4, d_model=C, n_heads=H, d_ff=FF, temperature="llama4", temperature_layers="nope")
    model = Transformer(cfg, V, T, True, pattern, Softmax)
    assert [b.attn.temperature is not None for b in model.blocks] == [False, True, False, True]
