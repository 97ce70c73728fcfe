"""The shipping models' RoPE, exact: tiny random models of each family transformers has, built with the family's
real rotary settings and head shapes, give the same logits with posbench's rotary in place of transformers' own
(harness/pretrained/rotary.py) over distances far beyond their original context; and the published figures of those
settings reproduced. Bugs of this kind were found in shipping code: YaRN's β_fast/β_slow swapped (torchtitan),
Gemma 3's per-layer bases (vLLM), YaRN's ``truncate`` (transformers).

transformers computes RoPE's angles in float32 whatever the model's dtype (``position.float() * inv_freq.float()``):
at position 20,000 an fp32 angle is off by up to ~1e-3 rad, its own rounding, not a difference of formula. So the
comparison runs transformers' code with its float32 steps in float64 (``float64_transformers``: ``float`` and
``float32`` read as float64 while the model is built and run), against posbench's fp64 angles: to 1e-9 in a float64
model; GPT-OSS and DeepSeek-V3, whose experts' grouped matmul takes no float64, in float32 to 1e-5."""

from __future__ import annotations

import contextlib
import copy
import sys
from unittest import mock

import pytest
import torch
import transformers

from harness.pretrained.rotary import apply_scaling, form_of, rotary_modules
from positional.rope_scaling import yarn_ramp_bounds


class _Float64Torch:
    """``torch`` as a transformers module sees it inside ``float64_transformers``: float and float32 mean float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


# imported here, before any float64_transformers() patches the modules already imported (transformers imports lazily)
MODELS = [
    transformers.LlamaForCausalLM,
    transformers.Qwen3ForCausalLM,
    transformers.GptOssForCausalLM,
    transformers.Gemma3ForCausalLM,
    transformers.Llama4ForCausalLM,
    transformers.DeepseekV3ForCausalLM,
    transformers.Phi3ForCausalLM,
]


@contextlib.contextmanager
def float64_transformers():
    """transformers' modules (rope utilities, every model's modeling file) with float32 read as float64."""
    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if name.startswith("transformers.") and getattr(module, "torch", None) is torch:
                stack.enter_context(mock.patch.object(module, "torch", _Float64Torch()))
        stack.enter_context(mock.patch.object(torch.Tensor, "float", torch.Tensor.double))
        yield


SMALL = dict(vocab_size=97, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
LLAMA_31 = {  # Llama 3.1's config.json
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
GPT_OSS = {  # gpt-oss-20b / 120b's config.json
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 4096,
    "truncate": False,
}


def llama31():
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **SMALL, hidden_size=64, head_dim=128, max_position_embeddings=131072, rope_parameters=LLAMA_31
        )
    )


def qwen3():  # Qwen3's model card: YaRN ×4 over its 32,768-token context, θ 1,000,000, head dim 128
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
    config = transformers.Qwen3Config(**SMALL, hidden_size=64, head_dim=128, max_position_embeddings=131072)
    config.rope_parameters = rope
    return transformers.Qwen3ForCausalLM(config)


def gpt_oss():
    config = transformers.GptOssConfig(
        **SMALL,
        hidden_size=64,
        head_dim=64,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=131072,
        rope_parameters=GPT_OSS,
    )
    return transformers.GptOssForCausalLM(config)


def gemma3(head_dim: int = 256, context: int = 131072, vocab: int = 97):
    """Gemma 3: local layers θ 10,000; global θ 1,000,000 with linear ×8; head dim 256."""
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
    }
    config = transformers.Gemma3TextConfig(
        **{**SMALL, "vocab_size": vocab},
        hidden_size=64,
        head_dim=head_dim,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=context,
        rope_parameters=rope,
    )
    return transformers.Gemma3ForCausalLM(config)


def llama4():  # Llama 4 Scout: llama3 ×16 with low = high = 1, NoPE every fourth layer, attention temperature
    rope = {**LLAMA_31, "factor": 16.0, "high_freq_factor": 1.0}
    config = transformers.Llama4TextConfig(
        **{**SMALL, "num_hidden_layers": 4},
        hidden_size=64,
        head_dim=128,
        intermediate_size_mlp=64,
        num_local_experts=2,
        num_experts_per_tok=1,
        attn_temperature_tuning=True,
        floor_scale=8192,
        attn_scale=0.1,
        max_position_embeddings=131072,
        rope_parameters=rope,
    )
    assert 0 in config.no_rope_layers and 1 in config.no_rope_layers  # some layers rotate, some do not
    return transformers.Llama4ForCausalLM(config)


def deepseek_v3():  # DeepSeek-V3: YaRN ×40 over 4,096, mscale = mscale_all_dim = 1, MLA rotating 64 dims
    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    }
    config = transformers.DeepseekV3Config(
        **{**SMALL, "num_key_value_heads": 2},
        hidden_size=64,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        moe_intermediate_size=32,
        max_position_embeddings=163840,
        rope_parameters=rope,
    )
    return transformers.DeepseekV3ForCausalLM(config)


def phi3():
    """Phi-3-mini-128k: LongRoPE over 4,096 with its rescale lists and no factor (transformers takes
    max_position_embeddings / original_max_position_embeddings, both at the config's top level)."""
    half = 16  # the head dim 32's frequencies (Phi-3's 96 has 48); short near 1, long growing with the wavelength
    config = transformers.Phi3Config(
        **SMALL,
        hidden_size=64,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling=PHI3,
        pad_token_id=0,
    )
    assert len(PHI3["short_factor"]) == half and "factor" not in config.rope_parameters
    return transformers.Phi3ForCausalLM(config)


PHI3 = {  # Phi-3-mini-128k's config.json form (v4 ``type``), its lists shortened to a head dim of 32
    "type": "longrope",
    "short_factor": [1.0 + 0.05 * i for i in range(16)],
    "long_factor": [1.0 + 1.5 * i for i in range(16)],
}

FAMILIES = {  # (build, a distance beyond the original context, the dtype it runs in)
    "llama3.1": (llama31, 20000, torch.float64),
    "qwen3": (qwen3, 100000, torch.float64),
    "gpt-oss": (gpt_oss, 50000, torch.float32),  # its experts' grouped matmul takes no float64
    "gemma3": (gemma3, 40000, torch.float64),
    "llama4": (llama4, 30000, torch.float64),
    "deepseek-v3": (deepseek_v3, 150000, torch.float32),  # the same
    "phi3": (phi3, 60000, torch.float64),
}


def logits(model, step: int) -> torch.Tensor:
    """24 tokens at positions 0, step, 2·step, …: distances up to 23·step."""
    ids = torch.arange(24)[None] * 7 % 97
    with torch.no_grad():
        return model(input_ids=ids, position_ids=torch.arange(24)[None] * step).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_posbench_rotary_gives_each_shipping_familys_logits_far_beyond_its_context(family):
    build, far, dtype = FAMILIES[family]
    step = far // 16  # the last tokens lie beyond the original context from the first
    with float64_transformers():
        torch.manual_seed(0)
        hf = build().to(dtype).eval()
        ours = copy.deepcopy(hf)
        applied = apply_scaling(ours)  # the model's own rope_parameters, read by posbench
        want, got = logits(hf, step), logits(ours, step)
        near = logits(hf, 1)
    assert all(type(m).__name__ == "ScaledRotary" for m in (getattr(p, n) for p, n in rotary_modules(ours)))
    if family == "gemma3":
        assert {t: (s.method, s.base) for t, s in applied.items()} == {
            "sliding_attention": ("none", 10000.0),
            "full_attention": ("linear", 1e6),
        }
    assert want.dtype == dtype and (want - near).abs().max() > 1e-3  # the distances matter to these logits
    # the same fp64 angles on both sides: float64 agrees to rounding; float32 to its own (cos and sin cast alike)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize(
    ("family", "form"),
    [("llama3.1", "doubled"), ("gpt-oss", "half"), ("llama4", "complex"), ("deepseek-v3", "doubled")],
)
def test_each_familys_rotary_form_is_read_from_its_module(family, form):
    torch.manual_seed(0)
    [(parent, name)] = rotary_modules(FAMILIES[family][0]())
    assert form_of(getattr(parent, name), None)[0] == form


def test_gpt_oss_yarn_correction_range_is_the_published_one():
    """GPT-OSS's YaRN (θ 150,000, ×32 over 4,096, β 32/1, ``truncate=False``): the ramp from pair 8.0928 to
    17.3980 of 32, the values the vLLM fix settled on; truncated it would be 8 … 18."""
    low, high = yarn_ramp_bounds(64, 150000.0, 4096, 1.0, 32.0, truncate=False)
    assert (round(low, 4), round(high, 4)) == (8.0928, 17.3980)
    assert yarn_ramp_bounds(64, 150000.0, 4096, 1.0, 32.0, truncate=True) == (8, 18)


def test_hf_eval_runs_a_model_with_rope_per_layer_type(tmp_path, store):
    """Gemma 3's form (a base per layer type) through the whole command: its own scaling and YaRN on both types'
    θ, each cell's losses read back from MLflow."""
    from mlflow.tracking import MlflowClient

    from harness.data.tokenizer import ByteTokenizer
    from harness.pretrained.export import tokenizer_files
    from harness.pretrained.hf_eval import main

    torch.manual_seed(0)
    gemma3(head_dim=64, context=64, vocab=258).save_pretrained(tmp_path / "gemma")  # the byte tokenizer's ids
    for name, text in tokenizer_files(ByteTokenizer(), 64).items():
        (tmp_path / "gemma" / name).write_text(str(text))
    uri = store  # a copy of the migrated empty store
    argv = [str(tmp_path / "gemma"), "--scalings", "own,yarn", "--factors", "2", "--lengths", "32,128"]
    assert main([*argv, "--budget", "128", "--key-short", "0", "--passkey-trials", "0", "--tracking-uri", uri]) == 0
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("hf-eval").experiment_id])
    cells = {r.data.tags.get("scaling"): r.data.metrics for r in runs if "val/loss_at_128" in r.data.metrics}
    assert set(cells) == {"own", "yarn"} and all(0 < m["val/loss_at_128"] < 10 for m in cells.values())
    assert cells["own"]["val/loss_at_32"] != cells["yarn"]["val/loss_at_32"]


def test_phi3s_config_json_without_a_longrope_factor_is_read_as_transformers_reads_it(tmp_path):
    """The folder check (harness/pretrained/folder.py) lets a longrope config leave its factor out, as Phi-3's does;
    posbench's rotary then takes the factor transformers takes, 131,072 / 4,096."""
    from harness.pretrained.folder import read_config

    phi3().config.to_json_file(tmp_path / "config.json")
    raw = read_config(tmp_path).as_dict()
    scaling = raw.get("rope_scaling") or raw["rope_parameters"]
    assert scaling["rope_type"] == "longrope" and "factor" not in scaling
    assert apply_scaling(phi3())[None].factor == 32.0
