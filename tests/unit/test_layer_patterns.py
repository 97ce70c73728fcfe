"""Per-layer patterns (harness/model/layers.py, harness/config/layers.py) and RoPE's rotate_heads.

A pattern model equals the same layers wired by hand (float64); a NoPE layer of a pattern sees no positions
(its block is permutation-equivariant, a RoPE layer's is not); rotate_heads matches x-transformers'
``rotate_num_heads``; a pattern is named, validated and refused per layer; it trains end to end into MLflow.
"""

from __future__ import annotations

import copy
import math
import re
from functools import partial

import pytest
import torch

from attention.base import AttentionContext
from attention.local import Local
from attention.softmax import Softmax
from harness.config.catalog import option_classes
from harness.errors import ConfigError, IncompatiblePairing
from harness.model.layers import LayeredScheme, LayerPattern, layer_names, pattern_label, unit_of_label
from harness.model.transformer import ModelConfig, Transformer
from positional.alibi import ALiBi
from positional.none import NoPosition
from positional.rope import Rope
from positional.t5 import T5Bias

F64 = torch.float64
SCHEMES = {
    "rope": partial(Rope, base=100.0),
    "none": NoPosition,
    "t5": partial(T5Bias, per_layer=True),
    "alibi": ALiBi,
    "rope(base=10000)": Rope,
}
VARIANTS = {"softmax": partial(Softmax, backend="math"), "local": partial(Local, window=4)}


def pattern(key, unit, factories):
    return LayerPattern(key, tuple(unit), {n: factories[n] for n in unit})


def model(pos, attn, n_layers=4, causal=False, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=n_layers, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    return Transformer(cfg, 40, 12, causal, pos=pos, attn=attn).double().eval()


def by_hand(m: Transformer, pos_names, attn_names, ids, causal):
    """The same weights, each layer given its own scheme's rotation and bias and its own variant, written out."""
    T, shape = ids.shape[1], m.pos.shape
    schemes = {n: m.pos.scheme(n) for n in set(pos_names)}  # the pattern's modules: learned tables included
    positions = torch.arange(T)
    x = m.tok_emb(ids)
    for layer, (block, p, a) in enumerate(zip(m.blocks, pos_names, attn_names, strict=True)):
        block = copy.deepcopy(block)
        block.attn.variant = VARIANTS[a](shape).double()
        scheme = schemes[p]
        ctx = AttentionContext(rotary=scheme.rotary(positions), bias=scheme.logit_bias(positions, layer), causal=causal)
        x = block(x, ctx)
    return torch.nn.functional.linear(m.head(m.norm_f(x)), m.tok_emb.weight, m.head_bias)


@pytest.mark.parametrize(
    "unit,attn_unit,n_layers,causal",
    [
        (["rope", "rope", "rope", "none"], ["local", "local", "local", "softmax"], 4, False),  # iRoPE × local:global
        (["rope", "none"], ["softmax"], 4, True),  # a unit of two, repeated twice
        (["t5", "none", "alibi"], ["local", "softmax"], 6, True),  # a per-layer table is indexed by the model's layer
        (["rope", "rope(base=10000)"], ["local", "softmax"], 4, True),  # Gemma: one θ on local layers, another global
    ],
)
def test_a_pattern_equals_its_layers_wired_by_hand(unit, attn_unit, n_layers, causal):
    m = model(pattern("pos.layers", unit, SCHEMES), pattern("attn.layers", attn_unit, VARIANTS), n_layers, causal)
    ids = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(1))
    want = by_hand(m, layer_names(unit, n_layers), layer_names(attn_unit, n_layers), ids, causal)
    torch.testing.assert_close(m(ids), want, rtol=0, atol=0)  # the same operations: bit for bit
    assert [type(b.attn.variant).__name__ for b in m.blocks] == [
        type(VARIANTS[a](m.pos.shape)).__name__ for a in layer_names(attn_unit, n_layers)
    ]


def test_a_pattern_of_one_scheme_is_that_scheme():
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2))
    plain = model(SCHEMES["rope"], VARIANTS["softmax"])
    layered = model(pattern("pos.layers", ["rope"], SCHEMES), pattern("attn.layers", ["softmax"], VARIANTS))
    torch.testing.assert_close(layered(ids), plain(ids), rtol=0, atol=0)


def block_inputs(m: Transformer, ids):
    """Each block's (hidden state, context) in one forward."""
    seen = []
    hooks = [b.register_forward_pre_hook(lambda _, args: seen.append(args)) for b in m.blocks]
    m(ids)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("unit", [["rope", "rope", "rope", "none"], ["none", "alibi"], ["t5", "none"]])
def test_a_nope_layer_sees_no_positions(unit):
    """Bidirectional attention without positions is permutation-equivariant: permuting a NoPE layer's input
    permutes its output. A layer with a scheme is not (it would be no positional scheme)."""
    m = model(pattern("pos.layers", unit, SCHEMES), VARIANTS["softmax"])
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(4))
    for layer, ((x, ctx), name) in enumerate(zip(block_inputs(m, ids), layer_names(unit, 4), strict=True)):
        block = m.blocks[layer]
        gap = (block(x[:, perm], ctx) - block(x, ctx)[:, perm]).abs().max().item()
        if name == "none":
            assert ctx.rotary is None and ctx.bias is None and gap < 1e-12, (layer, gap)
        else:
            assert gap > 1e-8, (layer, name, gap)  # float64 round-off is ~1e-16


def test_each_distinct_scheme_is_built_once_and_shared_by_its_layers():
    m = model(pattern("pos.layers", ["t5", "none"], {**SCHEMES, "t5": T5Bias}), VARIANTS["softmax"])
    assert isinstance(m.pos, LayeredScheme) and m.pos.names == ["t5", "none"] and len(m.pos.schemes) == 2
    assert sum(p.numel() for p in m.pos.parameters()) == sum(p.numel() for p in T5Bias(m.pos.shape).parameters())
    assert m.pos.hooks() == {"logit_bias"} and m.pos.layer_names == ["t5", "none", "t5", "none"]


def test_length_scaling_rescales_the_layers_whose_scheme_has_it():
    m = model(pattern("pos.layers", ["rope", "none"], SCHEMES), VARIANTS["softmax"])
    x, positions = torch.randn(1, 2, 12, 8, dtype=F64), torch.arange(12)
    plain = [r.rotate(x) if r else None for r in m.pos.rotaries(positions, 4)]
    assert "linear" in m.pos.length_scalings
    want = m.pos.scheme("rope").rotary(positions / 4).rotate(x)  # position interpolation, m → m/s, by hand
    with m.pos.rescaled("linear", 48):  # s = 48 / 12 on the RoPE layers, nothing on the others
        scaled = m.pos.rotaries(positions, 4)
    torch.testing.assert_close(scaled[0].rotate(x), want, rtol=0, atol=1e-12)
    assert scaled[1] is None and scaled[3] is None and (scaled[2].rotate(x) - plain[2]).abs().max() > 1e-3
    with pytest.raises(ConfigError, match="no scheme of pos=t5\\+none has 'linear'"):
        with model(pattern("pos.layers", ["t5", "none"], SCHEMES), VARIANTS["softmax"]).pos.rescaled("linear", 48):
            pass


def test_names_show_the_pattern():
    assert pattern_label(["rope", "rope", "rope", "none"]) == "rope×3+none"
    assert pattern_label(["local"] * 5 + ["softmax"]) == "local×5+softmax"
    assert pattern_label(["rope", "none", "rope"]) == "rope+none+rope"
    assert layer_names(["a", "b"], 6) == ["a", "b"] * 3
    for unit in (["rope", "rope", "rope", "none"], ["local"] * 5 + ["softmax"], ["a", "b", "a"], ["rope"]):
        assert unit_of_label(pattern_label(unit)) == tuple(unit)  # a name spells its pattern back (bench --pos)
    assert unit_of_label("rope*3+none") == ("rope", "rope", "rope", "none")
    assert unit_of_label("rope×5+rope(base=1e+6)") == ("rope",) * 5 + ("rope(base=1e+6)",)
    for bad in ("rope×0+none", "rope×x", "+none", "rope×"):
        with pytest.raises(ConfigError, match="is no pattern name: write option names joined by \\+"):
            unit_of_label(bad)


def test_bench_builds_a_pattern_from_its_name():
    from harness.bench.internals import option_overrides

    assert option_overrides("pos", "rope") == ["pos=rope"]
    assert option_overrides("pos", "rope×3+none") == ["pos=rope", "+pos.layers=[rope,rope,rope,none]"]
    assert option_overrides("attn", "local*2+softmax") == ["attn=local", "+attn.layers=[local,local,softmax]"]
    assert option_overrides("pos", "rope+rope(base=1e6)") == ["pos=rope", "+pos.layers=[rope,'rope(base=1e6)']"]


@pytest.mark.parametrize(
    "unit,n_layers,needle",
    [([], 4, "names no layer"), (["rope", "rope", "none"], 4, "has 3 entries, which does not divide model.n_layers=4")],
)
def test_bad_pattern_lengths_are_one_line_errors(unit, n_layers, needle):
    with pytest.raises(ConfigError, match=needle):
        layer_names(unit, n_layers)


def test_an_incompatible_layer_is_refused_naming_the_layer():
    from attention.performer import Performer
    from positional.xl import TransformerXL

    with pytest.raises(IncompatiblePairing, match=r"at layer 1 \(pos=xl, attn=performer\)"):
        model(pattern("pos.layers", ["none", "xl"], {**SCHEMES, "xl": TransformerXL}), Performer)
    with pytest.raises(IncompatiblePairing, match=r"at layer 3 \(pos=xl, attn=local\)"):
        model(partial(TransformerXL), pattern("attn.layers", ["softmax", "softmax", "softmax", "local"], VARIANTS))
    model(
        pattern("pos.layers", ["none", "xl"], {**SCHEMES, "xl": TransformerXL}),  # xl only on softmax layers
        pattern("attn.layers", ["local", "softmax"], VARIANTS),
    )


def test_a_scheme_that_adds_to_the_embeddings_is_refused_in_a_pattern():
    from positional.sinusoidal import Sinusoidal

    with pytest.raises(ConfigError, match="pos=sinusoidal adds to the token embeddings"):
        model(pattern("pos.layers", ["rope", "sinusoidal"], {**SCHEMES, "sinusoidal": Sinusoidal}), VARIANTS["softmax"])


# ---------------------------------------------------------------- through the config


def config(*overrides):
    """The RunSpec of TINY plus ``overrides``, and the options Hydra composed it from."""
    from tests.helpers import TINY, choices_of, compose, spec

    return spec(*overrides), choices_of(compose([*TINY, *overrides]))


def test_the_config_builds_the_pattern_from_the_node_and_the_other_options():
    spec, choices = config(
        "pos=rope", "pos.base=500", "+pos.layers=[rope,rope,rope,none]", "attn=local", "+attn.layers=[local,softmax]"
    )
    named = {g: getattr(spec.choices, g) for g in choices}
    assert named == {**choices, "pos": "rope×3+none", "attn": "local+softmax"}
    pos, attn = spec.pos.factory(), spec.attn.factory()
    m = Transformer(ModelConfig(n_layers=4, d_model=32, n_heads=2, d_ff=64), 40, 32, False, pos=pos, attn=attn)
    assert m.pos.scheme("rope").base == 500  # the node's own keys reach its layers
    assert isinstance(m.pos.scheme("none"), NoPosition)
    assert [type(b.attn.variant) for b in m.blocks] == [Local, Softmax] * 2
    assert m.blocks[0].attn.variant.window == spec.attn.option.kwargs["window"]


def test_diagnostics_need_the_weights_of_every_variant_a_pattern_names(monkeypatch):
    from attention.base import AttentionVariant
    from harness.config.check import check

    monkeypatch.setattr(Local, "weights", AttentionVariant.weights)  # as a variant without them
    spec, _ = config("diagnostics=true", "+attn.layers=[softmax,local]", "attn.backend=math")
    with pytest.raises(ConfigError, match="diagnostics=true needs the attention weights, which attn=local does not"):
        check(spec)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["+pos.layers=[rope,nope]"], "pos.layers names 'nope', which is no pos option; use names of conf/pos/"),
        (["+pos.layers=[none,alibi]"], "names no rope layer, so the pos=rope settings would be unused"),
        (["+pos.layers=5"], "pos.layers=5 must be a list of pos option names"),
    ],
)
def test_bad_patterns_in_the_config_are_one_line_errors(overrides, needle):
    with pytest.raises(ConfigError, match=needle):  # refused where the spec is typed, or when its pos is built
        config(*overrides)[0].pos.factory()


def test_every_option_without_an_embedding_can_be_a_layer():
    """A pattern takes every scheme that acts in attention: its YAML alone builds it (rope_trainable's
    ``defaults: [rope]`` merged)."""
    from positional.base import Shape

    layered = [n for n, cls in option_classes("pos").items() if "embed" not in cls.hooks() and n != "rope"]
    spec, _ = config("pos=rope", f"+pos.layers=[rope,{','.join(layered)}]")
    shape = Shape(32, 2, len(layered) + 1, 32, True)
    scheme = LayeredScheme(shape, spec.pos.factory())
    assert [s.config_name() for s in scheme.schemes] == ["rope", *layered]


def test_an_entry_with_settings_of_its_own_is_its_own_scheme():
    """Gemma 2/3: local layers θ = 10k, global layers θ = 1M; the other keys are the node's."""
    from positional.base import Shape

    spec, _ = config("pos=rope", "pos.layout=half", "+pos.layers=[rope,rope,'rope(base=1e6, layout=interleaved)']")
    assert spec.choices.pos == "rope×2+rope(base=1e6, layout=interleaved)"
    scheme = LayeredScheme(Shape(32, 2, 3, 32, True), spec.pos.factory())
    local, wide = scheme.layer_scheme(0), scheme.layer_scheme(2)
    assert (local.base, local.layout, wide.base, wide.layout) == (10000.0, "half", 1e6, "interleaved")
    assert scheme.layer_scheme(1) is local


@pytest.mark.parametrize(
    "entry,needle",
    [
        ("rope(bse=2)", "pos.layers[1].bse is not a key of pos=rope; use some of base, layout"),  # named where typed
        ("rope(base)", "pos.layers[1]='rope(base)' is no entry; write an option name, or one with settings"),
        ("rope(base=0)", "pos.layers[1].base=0 must be a positive finite number"),  # not pos.base, which was not set
    ],
)
def test_a_bad_entry_is_a_one_line_error(entry, needle):
    from positional.base import Shape

    with pytest.raises(ConfigError, match=re.escape(needle)):  # refused where the spec is typed, or when built
        LayeredScheme(Shape(32, 2, 2, 32, True), config("pos=rope", f"+pos.layers=[rope,'{entry}']")[0].pos.factory())


# ---------------------------------------------------------------- the matrix


def test_the_matrix_adds_a_row_and_a_column_per_pattern_refusing_where_any_layer_is_refused():
    from harness.config.compat import compatibility, render_text

    cells = {(c.pos, c.attn): c for c in compatibility(patterns={"pos": ("none", "xl"), "attn": ("local", "softmax")})}
    assert cells["none+xl", "softmax"].allowed and cells["none+xl", "local+softmax"].allowed  # xl on softmax layers
    assert cells["none+xl", "local"].refusal.startswith("layer 1: attn=local cannot apply a content logit bias")
    assert cells["xl", "local+softmax"].refusal.startswith("layer 0: attn=local cannot apply a content")
    assert cells["rope", "local+softmax"].allowed and cells["xl", "softmax"].refusal is None
    plain = {(c.pos, c.attn): c.refusal for c in compatibility()}
    assert all(cells[key].refusal == refusal for key, refusal in plain.items())  # the options' cells are unchanged
    assert len(cells) == len(plain) + len({p for p, _ in plain}) + len({a for _, a in plain}) + 1
    rows = render_text(list(cells.values())).splitlines()
    assert rows[0].split()[-1] == "local+softmax" and any(r.startswith("none+xl ") for r in rows)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["pos.layers=[rope,sinusoidal]"], "pos=sinusoidal adds to the token embeddings"),
        (["+attn.layers=[local,flash]"], "attn.layers names 'flash', which is no attn option"),
    ],
)
def test_the_matrix_refuses_a_bad_pattern_in_one_line(argv, needle):
    from harness.config.compat import print_matrix

    with pytest.raises(ConfigError, match=needle):
        print_matrix("--matrix", argv)


# ---------------------------------------------------------------- rotate_heads


def test_rotate_heads_turns_the_last_heads_only():
    q = torch.randn(2, 4, 9, 8, dtype=F64)
    shape = ModelConfig(d_model=32, n_heads=4)
    from positional.base import Shape

    s = Shape(shape.d_model, shape.n_heads, 1, 9, True)
    full, part = Rope(s).rotary(torch.arange(9)), Rope(s, rotate_heads=1).rotary(torch.arange(9))
    torch.testing.assert_close(part.rotate(q)[:, :3], q[:, :3], rtol=0, atol=0)
    torch.testing.assert_close(part.rotate(q)[:, 3:], full.rotate(q)[:, 3:], rtol=0, atol=0)
    phi = torch.rand(2, 4, 9, 6, dtype=F64)  # kernelized attention rotates φ(q) at its own width
    torch.testing.assert_close(part.at_width(6).rotate(phi)[:, :3], phi[:, :3], rtol=0, atol=0)


@pytest.mark.parametrize("k", [0, 5, 1.5])
def test_rotate_heads_out_of_range_is_refused(k):
    from positional.base import Shape

    with pytest.raises(ConfigError, match=f"rotate_heads={k} must be a whole number of heads in 1 … model.n_heads=4"):
        Rope(Shape(32, 4, 1, 9, True), rotate_heads=k)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_rotate_heads_matches_x_transformers_rotate_num_heads(k):
    pytest.importorskip("x_transformers")
    from x_transformers.x_transformers import Attention as XAttention
    from x_transformers.x_transformers import RotaryEmbedding

    from harness.model.transformer import Attention
    from positional.base import Shape

    H, D, T = 4, 8, 10
    torch.manual_seed(k)
    theirs = XAttention(H * D, dim_head=D, heads=H, causal=True, rotate_num_heads=k).double().eval()
    theirs.attend.attn_fn = partial(torch.softmax, dim=-1)  # its softmax casts to float32; the same in float64
    x = torch.randn(2, T, H * D, dtype=F64)
    rotary = RotaryEmbedding(D).double()
    rotary.inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=F64) / D))  # its θ in float64, as ours
    want = theirs(x, rotary_pos_emb=rotary(torch.arange(T)))

    ours = Attention(ModelConfig(d_model=H * D, n_heads=H), Softmax(Shape(H * D, H, 1, T, True), backend="math"))
    ours = ours.double()
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]))
        ours.qkv.bias.zero_()
        ours.out.weight.copy_(theirs.to_out.weight)
        ours.out.bias.zero_()
    rope = Rope(Shape(H * D, H, 1, T, True), rotate_heads=k).rotary(torch.arange(T))
    got = ours(x, AttentionContext(rotary=rope, causal=True))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert math.isfinite(got.abs().max().item())
