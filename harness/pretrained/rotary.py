"""posbench's RoPE scalings on a Hugging Face causal LM: its rotary module swapped for one fed by posbench.

transformers' decoder models (Llama, Mistral, Qwen2, SmolLM, GPT-NeoX, …) compute RoPE once per forward in a
``rotary_emb`` module, ``forward(x, position_ids) -> (cos, sin)``, with cos and sin of shape (B, T, R) — the R/2
angles m·θ_i written twice, [θ, θ] — each multiplied by the scaling's attention factor (HF applies YaRN's and
LongRoPE's factor to cos and sin, posbench's ``yarn_variant=hf`` convention). ``ScaledRotary`` returns the same
tensors from posbench's θ' (``RopeScaling.frequencies``, the length read as max(position) + 1, as HF's
``dynamic_rope_update`` does), so the attention layers are untouched and any scaling posbench implements runs
on the pretrained weights. Key mapping (tests/unit/test_hf_rope_parity.py): base ↔ rope_theta, fraction ↔
partial_rotary_factor, original_max_len ↔ original_max_position_embeddings (max_position_embeddings for dynamic
and for a model that states no original), alpha/beta ↔ beta_slow/beta_fast.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.errors import ConfigError
from positional.rope import hope_inv_freq, resonance_inv_freq, rope_inv_freq
from positional.rope_scaling import RopeScaling

HF_METHODS = {
    "default": "none",
    "linear": "linear",
    "dynamic": "dynamic_ntk",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
}


def rope_parameters(config) -> dict:
    """The model's RoPE settings as transformers v5 holds them (``rope_parameters``), or v4's ``rope_theta`` +
    ``rope_scaling``; a per-layer-type dict (v5 ``{"full_attention": {...}, ...}``) is refused here for now."""
    params = getattr(config, "rope_parameters", None)
    if params is None:
        legacy = dict(getattr(config, "rope_scaling", None) or {})
        params = {
            "rope_type": legacy.pop("rope_type", legacy.pop("type", "default")),
            "rope_theta": getattr(config, "rope_theta", 10000.0),
            **legacy,
        }
    params = dict(params)
    if "rope_theta" not in params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(
            f"rope_parameters per layer type ({', '.join(params)}): one scaling per layer type is not "
            "supported yet; give a model with one rope_parameters dict"
        )
    return params


def rotated_dims(config) -> int:
    """R: the head dim times ``partial_rotary_factor``, as transformers computes it (int, even)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    fraction = rope_parameters(config).get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    return int(head_dim * fraction)


def scaling_of(config, method: str | None = None, factor: float | None = None, **options) -> RopeScaling:
    """A ``RopeScaling`` for the model: its own ``rope_parameters`` (``method`` None), or ``method`` at ``factor``
    on its θ (the PI / NTK / YaRN papers' protocol: a pretrained model extended by each scaling in turn)."""
    params = rope_parameters(config)
    own = HF_METHODS.get(params.get("rope_type", "default"))
    if own is None:
        raise ConfigError(
            f"rope_type={params.get('rope_type')!r} has no posbench scaling; known: {', '.join(HF_METHODS)}"
        )
    max_pos = config.max_position_embeddings
    original = params.get("original_max_position_embeddings") or max_pos
    base, rotated = float(params["rope_theta"]), rotated_dims(config)
    if method is not None:  # posbench's scaling over the model's plain θ, trained at its context length
        variant = {"yarn_variant": "hf"} if method in ("yarn", "dynamic_ntk") else {}
        return RopeScaling(
            method=method,
            factor=factor or 1.0,
            original_max_len=original,
            base=base,
            rotated=rotated,
            **{**variant, **options},
        )
    if own == "none":
        return RopeScaling(base=base, rotated=rotated)
    if own == "dynamic_ntk":
        return RopeScaling(
            method=own,
            factor=float(params.get("factor", 1.0)),
            yarn_variant="hf",
            original_max_len=max_pos,
            base=base,
            rotated=rotated,
        )
    read = {
        "yarn": {
            "alpha": params.get("beta_slow", 1.0),
            "beta": params.get("beta_fast", 32.0),
            "yarn_variant": "hf",
            "truncate": params.get("truncate", True),
            "mscale": params.get("mscale"),
            "mscale_all_dim": params.get("mscale_all_dim"),
            "attention_factor": params.get("attention_factor"),
        },
        "llama3": {
            "low_freq_factor": params.get("low_freq_factor", 1.0),
            "high_freq_factor": params.get("high_freq_factor", 4.0),
        },
        "longrope": {
            "short_factor": params.get("short_factor"),
            "long_factor": params.get("long_factor"),
            "attention_factor": params.get("attention_factor"),
        },
    }.get(own, {})
    factor = params.get("factor") or (max_pos / original if own == "longrope" else 1.0)
    return RopeScaling(method=own, factor=float(factor), original_max_len=original, base=base, rotated=rotated, **read)


class ScaledRotary(nn.Module):
    """A drop-in for transformers' ``<Model>RotaryEmbedding``: (cos, sin) of (B, T, R) from posbench's θ'.

    ``resonance``, ``hope``: posbench's schemes beyond transformers', on the pretrained θ as positional/rope.py
    applies them (HoPE's selection at the trained context ``hope``, then Resonance's rounding, then the scaling)."""

    def __init__(self, scaling: RopeScaling, resonance: bool = False, hope: int | None = None):
        super().__init__()
        if scaling.base is None or scaling.rotated is None:
            raise ConfigError("ScaledRotary needs the scaling's base and rotated width (scaling_of sets them)")
        self.scaling = scaling  # θ is derived in fp64 at each call: no buffer a model.to(bfloat16) would round
        self.base, self.rotated = scaling.base, scaling.rotated  # the θ being scaled
        self.resonance, self.hope = resonance, hope
        if hope and not self.theta().any():
            raise ConfigError(
                f"+hope keeps the frequencies that turn within the trained context ({hope} tokens): "
                "none does here; drop +hope"
            )

    def theta(self, device=None) -> Tensor:
        """The unscaled θ (R/2,), fp64: the model's, then HoPE's selection and Resonance's rounding where set."""
        theta = rope_inv_freq(self.rotated, self.base, torch.float64, device)
        if self.hope:
            theta = hope_inv_freq(theta, self.hope)
        return resonance_inv_freq(theta) if self.resonance else theta

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        length = int(position_ids.max()) + 1
        scaled = self.scaling.frequencies(self.theta(x.device), length)
        angles = position_ids[..., None].double() * scaled.inv_freq  # (B, T, R/2), fp64
        emb = angles.repeat(1, 1, 2)  # (B, T, R): [θ, θ] as transformers lays them out
        return (emb.cos() * scaled.attention_scale).to(x.dtype), (emb.sin() * scaled.attention_scale).to(x.dtype)


def rotary_modules(model) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of every module of ``model`` named ``rotary_emb``: where transformers keeps RoPE."""
    found = [
        (parent, name) for parent in model.modules() for name, child in parent.named_children() if name == "rotary_emb"
    ]
    if not found:
        raise ConfigError(
            f"{type(model).__name__} has no rotary_emb module: not a RoPE model transformers builds "
            "that way (Llama, Mistral, Qwen2, SmolLM, GPT-NeoX …)"
        )
    return found


def apply_scaling(
    model, scaling: RopeScaling | None = None, resonance: bool = False, hope: bool = False, **how
) -> RopeScaling:
    """Swap ``model``'s rotary module(s) for posbench's: ``scaling``, or ``scaling_of(model.config, **how)``
    (``method=``, ``factor=``, options); ``resonance``, ``hope``: Resonance RoPE's and HoPE's θ on top (HoPE keeps
    the frequencies that turn within the trained context). Returns the scaling applied."""
    scaling = scaling or scaling_of(model.config, **how)
    context = scaling.original_max_len or model.config.max_position_embeddings
    for parent, name in rotary_modules(model):
        setattr(parent, name, ScaledRotary(scaling, resonance, context if hope else None))
    return scaling
