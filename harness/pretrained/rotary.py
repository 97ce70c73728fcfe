"""posbench's RoPE scalings on a Hugging Face causal LM: its rotary module swapped for one fed by posbench.

transformers' decoder models compute RoPE once per forward in a ``rotary_emb`` module, ``forward(x, position_ids)``,
from which every attention layer rotates q and k. ``ScaledRotary`` returns what the module it replaces returned, from
posbench's θ' (``RopeScaling.frequencies``, the length read as max(position) + 1, as HF's ``dynamic_rope_update``
does), times the scaling's attention factor (HF applies YaRN's and LongRoPE's factor to cos and sin, posbench's
``yarn_variant=hf`` convention), so the attention layers are untouched and any scaling posbench implements runs on
the pretrained weights. What each family's module returns is read from the module itself (one call at position 0,
against its ``inv_freq`` of R/2 angles): (cos, sin) of the angles written twice, [θ, θ] (Llama, Qwen, Mistral,
DeepSeek, Gemma, GPT-NeoX); (cos, sin) of the R/2 angles once (GPT-OSS); complex e^{iθ} (Llama 4). A module with
rope_parameters per layer type (Gemma 3: ``forward(x, position_ids, layer_type)``, ``<type>_inv_freq``) gets one
scaling per type. Key mapping (tests/unit/test_hf_rope_parity.py): base ↔ rope_theta, fraction ↔
partial_rotary_factor, original_max_len ↔ original_max_position_embeddings (max_position_embeddings for dynamic
and for a model that states no original), alpha/beta ↔ beta_slow/beta_fast.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.errors import ConfigError
from harness.pretrained.rope_parameters import of_config, per_layer_type
from positional.rope import rope_frequencies
from positional.rope_scaling import RopeScaling

HF_METHODS = {
    "default": "none",
    "linear": "linear",
    "dynamic": "dynamic_ntk",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
}


def rope_parameters(config, layer_type: str | None = None) -> dict:
    """The model's RoPE settings as transformers v5 holds them (``rope_parameters``), or v4's ``rope_theta`` +
    ``rope_scaling``; those of ``layer_type`` where they are given per layer type (v5 ``{"full_attention": {...},
    "sliding_attention": {...}}``, ``layer_types``)."""
    params = of_config(config)
    if per_layer_type(params):
        if layer_type not in params or not isinstance(params[layer_type], dict):
            raise ConfigError(
                f"rope_parameters per layer type ({', '.join(params)}) hold no RoPE for layer type {layer_type!r}"
            )
        return dict(params[layer_type])
    return dict(params)


def scaling_of(
    config,
    method: str | None = None,
    factor: float | None = None,
    layer_type: str | None = None,
    rotated: int | None = None,
    **options,
) -> RopeScaling:
    """A ``RopeScaling`` for the model (of ``layer_type``'s layers, where its rope_parameters are per layer type): its
    own ``rope_parameters`` (``method`` None), or ``method`` at ``factor`` on its θ (the PI / NTK / YaRN papers'
    protocol: a pretrained model extended by each scaling in turn). ``rotated``: R, where the rotary module says it
    (DeepSeek's MLA rotates ``qk_rope_head_dim``, not its head dim)."""
    params = rope_parameters(config, layer_type)
    own = HF_METHODS.get(params.get("rope_type", "default"))
    if own is None:
        raise ConfigError(
            f"rope_type={params.get('rope_type')!r} has no posbench scaling; known: {', '.join(HF_METHODS)}"
        )
    max_pos = config.max_position_embeddings
    original = params.get("original_max_position_embeddings") or max_pos
    base = float(params["rope_theta"])
    if not rotated:  # R: the head dim times partial_rotary_factor, as transformers computes it (int, even)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotated = int(head_dim * params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
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
    # transformers reads a null or 0 beta as its default, and the mscale pair only when both are non-zero and no
    # attention_factor is given
    pair = params.get("attention_factor") is None and params.get("mscale") and params.get("mscale_all_dim")
    read = {
        "dynamic_ntk": {"yarn_variant": "hf"},
        "yarn": {
            "alpha": params.get("beta_slow") or 1.0,
            "beta": params.get("beta_fast") or 32.0,
            "yarn_variant": "hf",
            "truncate": params.get("truncate", True),
            "mscale": params.get("mscale") if pair else None,
            "mscale_all_dim": params.get("mscale_all_dim") if pair else None,
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
    # a longrope or yarn factor left out or null is max_position_embeddings ÷ the original, as transformers takes it
    factor = params.get("factor") or (max_pos / original if own in ("longrope", "yarn") else 1.0)
    if own == "longrope":  # its factor sets only the attention factor, which is 1 for any factor ≤ 1
        factor = max(factor, 1.0)
    # dynamic NTK scales from max_position_embeddings, as transformers' dynamic_rope_update does
    return RopeScaling(
        method=own,
        factor=float(factor),
        original_max_len=max_pos if own == "dynamic_ntk" else original,
        base=base,
        rotated=rotated,
        **read,
    )


class ScaledRotary(nn.Module):
    """A drop-in for transformers' ``<Model>RotaryEmbedding``: what it returned (``form``: "doubled", "half" or
    "complex", this module's docstring), from posbench's θ' — one scaling per layer type, keyed None for a model
    with one.

    ``resonance``, ``hope``: posbench's schemes beyond transformers', on the pretrained θ as positional/rope.py
    applies them (HoPE's selection at the trained context ``hope``, then Resonance's rounding, then the scaling)."""

    def __init__(
        self,
        scalings: dict[str | None, RopeScaling],
        form: str = "doubled",
        resonance: bool = False,
        hope: int | None = None,
    ):
        super().__init__()
        self.scalings, self.form = scalings, form  # θ is derived in fp64 at each call: no buffer to round
        self.resonance, self.hope = resonance, hope
        if hope and not all(self.theta(s).any() for s in scalings.values()):
            raise ConfigError(
                f"+hope keeps the frequencies that turn within the trained context ({hope} tokens): "
                "none does here; drop +hope"
            )

    def theta(self, scaling: RopeScaling, device=None) -> Tensor:
        """The unscaled θ (R/2,), fp64: the model's, then HoPE's selection and Resonance's rounding where set."""
        assert scaling.base is not None and scaling.rotated is not None, "scaling_of sets both"
        return rope_frequencies(scaling.rotated, scaling.base, self.hope, self.resonance, device=device)

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None):
        scaling = self.scalings[layer_type]
        scaled = scaling.frequencies(self.theta(scaling, x.device), int(position_ids.max()) + 1)
        angles = position_ids[..., None].double() * scaled.inv_freq  # (B, T, R/2), fp64
        if self.form == "complex":  # e^{iθ}, complex64 as transformers' from float32 angles (complex128 in float64)
            unit = torch.polar(torch.full_like(angles, scaled.attention_scale), angles)
            return unit.to(torch.complex128 if x.dtype == torch.float64 else torch.complex64)
        emb = angles if self.form == "half" else torch.cat((angles, angles), dim=-1)  # [θ, θ] as transformers
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


def form_of(module: nn.Module, layer_type: str | None) -> tuple[str, int]:
    """(what ``module`` returns — "doubled", "half" or "complex" —, R) read from one call at position 0, against
    its ``inv_freq`` (``<layer_type>_inv_freq``) of R/2 angles; a ``ScaledRotary`` (swapped in before: hf-eval's
    cells, one after the other) says its own."""
    if isinstance(module, ScaledRotary):
        return module.form, module.scalings[layer_type].rotated or 0
    inv_freq = getattr(module, f"{layer_type}_inv_freq" if layer_type else "inv_freq", None)
    if not isinstance(inv_freq, Tensor):
        raise ConfigError(f"{type(module).__name__} keeps no inv_freq: not a rotary module posbench can stand in for")
    x, position = (
        torch.zeros(1, 1, 1, device=inv_freq.device),
        torch.zeros(1, 1, dtype=torch.long, device=inv_freq.device),
    )
    with torch.no_grad():
        out = module(x, position, layer_type) if layer_type else module(x, position)
    half = len(inv_freq)
    width = out.shape[-1] if isinstance(out, Tensor) else out[0].shape[-1]
    if isinstance(out, Tensor) and out.is_complex() and width == half:
        return "complex", 2 * half
    if not isinstance(out, Tensor) and width in (half, 2 * half):
        return "half" if width == half else "doubled", 2 * half
    raise ConfigError(
        f"{type(module).__name__} returns {type(out).__name__} of width {width} for {half} angles: a rotary "
        "form posbench does not know"
    )


def layer_types_of(config) -> list[str | None]:
    """The layer types with rope_parameters of their own (Gemma 3's full and sliding attention), else [None]."""
    params = of_config(config)
    return [t for t, p in params.items() if isinstance(p, dict)] if per_layer_type(params) else [None]


def apply_scaling(
    model, scaling: RopeScaling | None = None, resonance: bool = False, hope: bool = False, **how
) -> dict[str | None, RopeScaling]:
    """Swap ``model``'s rotary module(s) for posbench's: ``scaling``, or per layer type ``scaling_of(model.config,
    **how)`` (``method=``, ``factor=``, options; a method applies to every layer type's θ); ``resonance``, ``hope``:
    Resonance RoPE's and HoPE's θ on top (HoPE keeps the frequencies that turn within the trained context). Returns
    the scalings applied, by layer type (None: one for the model)."""
    applied: dict[str | None, RopeScaling] = {}
    for parent, name in rotary_modules(model):
        original, forms = getattr(parent, name), {}
        for layer_type in layer_types_of(model.config):
            form, rotated = form_of(original, layer_type)
            forms[layer_type] = form
            applied[layer_type] = scaling or scaling_of(model.config, layer_type=layer_type, rotated=rotated, **how)
        if len(set(forms.values())) != 1:
            raise ConfigError(f"{type(original).__name__} returns another form per layer type: {forms}")
        trained = min(s.original_max_len or model.config.max_position_embeddings for s in applied.values())
        setattr(
            parent, name, ScaledRotary(dict(applied), next(iter(forms.values())), resonance, trained if hope else None)
        )
    return applied
