"""transformers v5's ``rope_parameters`` (flat and nested per layer type) read into posbench's per-layer patterns and
written back from a posbench model: the frequencies and rotations of each layer against transformers' own rotary
modules (GPT-NeoX for a flat dict with partial rotary, Gemma 3 for one nested by layer type)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from harness.errors import ConfigError
from harness.pretrained.rope_parameters import read, read_config, write
from tests.helpers import TINY, gemma3

transformers = pytest.importorskip("transformers")

HEAD_DIM = 16  # TINY: d_model 32, 2 heads


def built(overrides: list[str]):
    """The posbench model the overrides describe (TINY's size), causal, on the CPU."""
    from harness.config.load import load
    from harness.model.transformer import Transformer

    spec = load([*TINY, "task=clm", *overrides])
    return Transformer(spec.model, 258, 32, True, pos=spec.pos.factory(), attn=spec.attn.factory())


def layers_of(model):
    return model.layers()


def test_a_nested_dict_per_layer_type_reads_into_patterns_with_transformers_frequencies_per_layer():
    """Gemma 3: three sliding-window layers at θ = 10k, one global layer at θ = 1M. Each posbench layer's θ_i is
    transformers' ``<type>_inv_freq`` and its rotation of q is transformers' ``apply_rotary_pos_emb`` with the
    cos, sin of ``Gemma3RotaryEmbedding(x, position_ids, layer_type)``."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding, apply_rotary_pos_emb

    config = gemma3()
    layers = read_config(config)
    assert layers.attn == ("local(window=16)",) * 3 + ("softmax",)
    model = built(layers.overrides())
    hf = Gemma3RotaryEmbedding(config)
    q = torch.randn(1, 2, 32, HEAD_DIM)
    positions = torch.arange(32)[None]
    for i, (scheme, variant) in enumerate(layers_of(model)):
        layer_type = config.layer_types[i]
        assert variant.config_name() == {"sliding_attention": "local", "full_attention": "softmax"}[layer_type]
        assert getattr(variant, "window", 16) == 16
        theirs = getattr(hf, f"{layer_type}_inv_freq").double()
        torch.testing.assert_close(scheme.inv_freq, theirs, rtol=1e-6, atol=0)
        cos, sin = hf(q, positions, layer_type)
        want = apply_rotary_pos_emb(q, q, cos, sin)[0]
        rotation = scheme.rotaries(torch.arange(32), 4)[i]
        torch.testing.assert_close(rotation.rotate_q(q), want, rtol=1e-5, atol=1e-5)
    params, types = write(layers_of(model))
    assert types == config.layer_types
    assert params == {
        t: {k: config.rope_parameters[t][k] for k in ("rope_type", "rope_theta")}
        for t in ("sliding_attention", "full_attention")
    }


def test_a_flat_dict_with_partial_rotary_reads_into_one_scheme_and_writes_back_flat():
    """GPT-NeoX: one dict for every layer, RoPE on a quarter of each head (partial_rotary_factor 0.25)."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    config = GPTNeoXConfig(
        vocab_size=258,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
    )
    layers = read_config(config)
    assert layers.overrides() == [
        "pos=rope",
        "pos.base=500.0",
        "pos.fraction=0.25",
        "pos.layout=half",
        "model.n_layers=2",
        "attn=softmax",
    ]
    model = built(layers.overrides())
    theirs = GPTNeoXRotaryEmbedding(config).inv_freq.double()
    assert theirs.shape == (2,)  # R/2 for R = 0.25 · 16
    torch.testing.assert_close(model.pos.inv_freq, theirs, rtol=1e-6, atol=0)
    assert write(layers_of(model)) == (
        {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        ["full_attention", "full_attention"],
    )


def test_a_layer_type_without_rope_is_nope_and_nope_is_written_as_none():
    layers = read(
        {"full_attention": None, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        ["sliding_attention", "full_attention"],
        2,
        sliding_window=8,
    )
    assert layers.pos == ("rope(base=10000.0,layout=half)", "none")
    model = built(layers.overrides())
    assert [s.config_name() for s, _ in layers_of(model)] == ["rope", "none"]
    params, types = write(layers_of(model))
    assert params == {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None}
    assert types == ["sliding_attention", "full_attention"]


@pytest.mark.parametrize(
    "params, types, needle",
    [
        ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, None, "rope_type='yarn' is a length scaling"),
        (
            {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1]},
            None,
            "key 'mrope_section' has no posbench",
        ),
        ({"full_attention": {"rope_type": "default"}}, ["chunked_attention", "full_attention"], "'chunked_attention'"),
        ({"full_attention": {"rope_type": "default"}}, ["sliding_attention", "full_attention"], "no entry for"),
        ({"rope_type": "default"}, ["sliding_attention", "full_attention"], "need the config's sliding_window"),
        ({"rope_type": "default"}, ["full_attention"], "layer_types has 1 entries for 2 layers"),
    ],
)
def test_what_has_no_posbench_form_is_refused_naming_it(params, types, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        read(params, types, 2)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["pos=alibi"], "pos=alibi has no transformers rope_parameters form"),
        (["pos=rope", "pos.resonance=true"], "pos.resonance has no key"),
        (["attn=performer"], "attn=performer has no transformers layer type"),
        (
            ["pos=rope", "model.n_layers=2", "+pos.layers=[rope,'rope(base=500)']", "attn=softmax"],
            "two full_attention layers with different RoPE settings",
        ),
    ],
)
def test_a_model_the_format_cannot_hold_is_refused_naming_why(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        write(layers_of(built(overrides)))


def test_a_v4_config_reads_as_transformers_reads_it_on_both_paths():
    """v4's rope_theta + rope_scaling: the scaling's own keys come first, then the config's rope_theta and
    partial_rotary_factor, and ``type`` is v4's name for rope_type (transformers' ``standardize_rope_params``);
    hf-rope's reading (``read_config``) and the rotary swap's (``rotary.rope_parameters``) say the same."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from harness.pretrained.rotary import rope_parameters

    v4 = {
        "num_hidden_layers": 2,
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.25,
        "rope_scaling": {"type": "default", "partial_rotary_factor": 0.5},
    }
    theirs = LlamaConfig.from_dict(v4).rope_parameters
    assert (theirs["rope_type"], theirs["rope_theta"], theirs["partial_rotary_factor"]) == ("default", 500.0, 0.5)
    assert rope_parameters(SimpleNamespace(**v4)) == {
        k: theirs[k] for k in ("rope_type", "rope_theta", "partial_rotary_factor")
    }
    assert read_config(v4).pos == ("rope(base=500.0,fraction=0.5,layout=half)",) * 2


def test_a_flat_dict_takes_the_configs_own_theta_and_partial_rotary_where_it_gives_none():
    """A config.json whose rope_parameters leave out rope_theta and partial_rotary_factor, given beside them: both
    are read from the config, as transformers' ``convert_rope_params_to_dict`` does."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from harness.pretrained.rotary import rope_parameters

    v5 = {
        "num_hidden_layers": 2,
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.5,
        "rope_parameters": {"rope_type": "default"},
    }
    theirs = LlamaConfig.from_dict({**v5, "rope_parameters": {"rope_type": "default"}}).rope_parameters
    assert theirs == {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    assert rope_parameters(SimpleNamespace(**v5)) == theirs
    assert read_config(v5).pos == ("rope(base=500.0,fraction=0.5,layout=half)",) * 2


def test_a_nested_dict_takes_the_configs_own_theta_and_partial_rotary_where_it_gives_none():
    """rope_parameters per layer type whose entries leave out rope_theta and partial_rotary_factor, given beside
    them: each entry takes both from the config, as transformers' ``convert_rope_params_to_dict`` does."""
    from types import SimpleNamespace

    from transformers import Qwen3Config

    from harness.pretrained.rotary import rope_parameters

    nested = {
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.5,
        "rope_parameters": {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}},
    }
    theirs = Qwen3Config.from_dict(copy.deepcopy(nested)).rope_parameters
    assert theirs["full_attention"] == {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    for layer_type in ("sliding_attention", "full_attention"):
        assert rope_parameters(SimpleNamespace(**nested), layer_type) == theirs[layer_type]
    assert read_config(nested).pos == ("rope(base=500.0,fraction=0.5,layout=half)",) * 2
    assert nested["rope_parameters"]["full_attention"] == {"rope_type": "default"}  # the caller's dict unchanged


def test_gpt_neoxs_own_names_for_theta_and_partial_rotary_are_read_as_transformers_reads_them(tmp_path):
    """GPT-NeoX's config.json (Pythia's) names θ ``rotary_emb_base`` and the rotated fraction ``rotary_pct``;
    transformers' GPTNeoXConfig reads them as rope_theta and partial_rotary_factor."""
    import json
    from types import SimpleNamespace

    from transformers import GPTNeoXConfig

    from harness.pretrained.rotary import rope_parameters

    pythia = {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "max_position_embeddings": 128,
        "rotary_emb_base": 500,
        "rotary_pct": 0.25,
    }
    theirs = GPTNeoXConfig.from_dict(copy.deepcopy(pythia)).rope_parameters
    assert (theirs["rope_theta"], theirs["partial_rotary_factor"]) == (500, 0.25)
    assert rope_parameters(SimpleNamespace(**pythia)) == theirs
    (tmp_path / "config.json").write_text(json.dumps(pythia))
    assert read_config(tmp_path).pos == ("rope(base=500.0,fraction=0.25,layout=half)",) * 2


def test_gemma_3s_v4_config_gives_its_sliding_layers_their_own_theta(tmp_path):
    """Gemma 3's v4 config.json: rope_theta (and rope_scaling) belong to the full-attention layers, the sliding ones
    turn at ``rope_local_base_freq``, as transformers' Gemma3TextConfig reads it."""
    import json
    from types import SimpleNamespace

    from transformers import Gemma3TextConfig

    from harness.pretrained.rotary import rope_parameters

    v4 = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": None,
    }
    theirs = Gemma3TextConfig.from_dict(copy.deepcopy(v4)).rope_parameters
    for layer_type in ("sliding_attention", "full_attention"):
        assert rope_parameters(SimpleNamespace(**v4), layer_type) == theirs[layer_type]
    (tmp_path / "config.json").write_text(json.dumps(v4))
    assert read_config(tmp_path).pos == ("rope(base=10000.0,layout=half)", "rope(base=1000000.0,layout=half)")


def test_a_window_without_layer_types_is_refused_and_an_unused_one_read_as_full_attention(tmp_path):
    """Mistral 7B v0.1's and Phi-3 mini 4k's config.json give sliding_window and no layer_types: transformers slides
    every layer of theirs (Gemma 2's v4 config, every other one), so full attention would be another model. Qwen2's
    gives one with use_sliding_window false, which transformers does not apply."""
    import json

    from transformers import MistralConfig, MistralForCausalLM

    mistral = {"model_type": "mistral", "num_hidden_layers": 2, "rope_theta": 10000.0, "sliding_window": 4}
    size = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4)
    torch.manual_seed(0)
    slid = MistralForCausalLM(MistralConfig(**size, **mistral)).eval()
    full = MistralForCausalLM(MistralConfig(**size, **{**mistral, "sliding_window": None})).eval()
    full.load_state_dict(slid.state_dict())
    ids = torch.randint(50, (1, 16))
    with torch.no_grad():
        assert not torch.allclose(slid(ids).logits, full(ids).logits)  # the window is part of the model
    (tmp_path / "config.json").write_text(json.dumps(mistral))
    with pytest.raises(ConfigError, match="sliding_window=4 without layer_types"):
        read_config(tmp_path)
    qwen2 = {"model_type": "qwen2", "num_hidden_layers": 2, "sliding_window": 4, "use_sliding_window": False}
    (tmp_path / "config.json").write_text(json.dumps(qwen2))
    assert read_config(tmp_path).attn == ("softmax", "softmax")
