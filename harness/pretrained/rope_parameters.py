"""transformers v5's ``rope_parameters``, read into posbench's per-layer patterns and written from a posbench model.

transformers v5 keeps a model's RoPE settings in ``config.rope_parameters``: one dict for every layer (flat,
``{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}``) or one per layer type (nested,
keyed by the names of ``config.layer_types``: ``{"full_attention": {...}, "sliding_attention": {...}}``, Gemma 3's
θ = 1M on global layers and 10k on local ones; a layer type mapped to None has no RoPE). posbench says the same
with per-layer patterns, ``pos.layers`` beside ``attn.layers`` (harness/model/layers.py), one entry per layer:

    transformers                          posbench
    rope_theta                            rope's base
    partial_rotary_factor                 rope's fraction (the first R = fraction·D dims of each head rotate)
    rope_type "default"                   rope. The other rope types (linear, dynamic, yarn, llama3, longrope)
                                          are length scalings, which posbench applies at evaluation (pos.scaling,
                                          eval.scalings) and to pretrained models (harness/pretrained/rotary.py),
                                          not per layer in training: refused here
    a layer type's None                   none (NoPE)
    "full_attention" / "sliding_attention"  attn softmax / local (window = config.sliding_window)

transformers rotates the pairs (x_i, x_{i+R/2}) (``rotate_half``), so a model read from its dict takes
``layout=half``; written, the dict does not say which layout posbench trained with (the two differ by a fixed
permutation of each head's q and k weights, which an export of the weights would apply).

Nothing here imports transformers: a config is a dict (config.json) or any object with these attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness import integrity
from harness.errors import ConfigError

if TYPE_CHECKING:
    from attention.base import AttentionVariant
    from positional.base import PositionalScheme

ATTN_OF_TYPE = {"full_attention": "softmax", "sliding_attention": "local"}
TYPE_OF_ATTN = {v: k for k, v in ATTN_OF_TYPE.items()}
READ_KEYS = {"rope_type", "rope_theta", "partial_rotary_factor"}
SCALED_FROM = ("llama3", "yarn", "longrope")  # rope types with an original_max_position_embeddings


@dataclass(frozen=True)
class Layers:
    """Per layer: posbench's pos entry (``rope(base=…,fraction=…,layout=half)`` or ``none``) and attn entry."""

    pos: tuple[str, ...]
    attn: tuple[str, ...]

    def overrides(self) -> list[str]:
        """The command-line overrides that build these layers (a uniform model needs no pattern; a pos pattern mixes
        rope with none, and needs a layer named like pos=)."""
        return [*_group("pos", self.pos, "rope"), f"model.n_layers={len(self.pos)}", *_group("attn", self.attn)]


def _group(group: str, entries: tuple[str, ...], mixed: str | None = None) -> list[str]:
    """One group's overrides: the same ``rope(base=1,fraction=0.5)`` on every layer -> [pos=rope, pos.base=1,
    pos.fraction=0.5]; a pattern -> the group named ``mixed`` (None: as its first layer) and its ``layers``."""
    name, _, inside = entries[0].partition("(")
    if len(set(entries)) > 1:  # a Hydra list, entries with settings quoted (Hydra would read rope(…) as a call)
        listed = ",".join(f"'{e}'" if "(" in e else e for e in entries)
        return [f"{group}={mixed or name}", f"+{group}.layers=[{listed}]"]
    return [f"{group}={name}", *(f"{group}.{pair}" for pair in inside.rstrip(")").split(",") if pair)]


def read(
    rope_parameters: dict, layer_types: list[str] | None, n_layers: int, sliding_window: int | None = None
) -> Layers:
    """posbench's layers for a model with these ``rope_parameters`` (flat or nested by layer type) and
    ``layer_types`` (one per layer; None: every layer full attention)."""
    if not layer_types and sliding_window:
        raise ConfigError(
            f"sliding_window={sliding_window} without layer_types: transformers slides the layers this model's family "
            "picks (Mistral's and Phi-3's every one, Gemma 2's every other); add layer_types to the config, one "
            "full_attention or sliding_attention per layer"
        )
    types = list(layer_types) if layer_types else ["full_attention"] * n_layers
    if len(types) != n_layers:
        raise ConfigError(f"layer_types has {len(types)} entries for {n_layers} layers; give one per layer")
    unknown = sorted(set(types) - set(ATTN_OF_TYPE))
    if unknown:
        raise ConfigError(f"layer type {unknown[0]!r} has no posbench attention; known: {', '.join(ATTN_OF_TYPE)}")
    nested = bool(rope_parameters) and all(k in types or k in ATTN_OF_TYPE for k in rope_parameters)
    pos = []
    for t in types:
        if nested and t not in rope_parameters:
            raise ConfigError(
                f"rope_parameters is nested by layer type but has no entry for {t!r}; give one "
                "(None for a layer type without RoPE)"
            )
        pos.append(_entry(rope_parameters[t] if nested else rope_parameters, t))
    if "sliding_attention" in types and not sliding_window:
        raise ConfigError("sliding_attention layers need the config's sliding_window (the window they attend)")
    attn = tuple(f"local(window={sliding_window})" if t == "sliding_attention" else "softmax" for t in types)
    return Layers(tuple(pos), attn)


def _entry(params: dict | None, layer_type: str) -> str:
    if params is None:
        return "none"
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(
            f"{layer_type}: rope_type={rope_type!r} is a length scaling; posbench applies scalings at "
            "evaluation (pos.scaling, eval.scalings), not per layer in training: read the model with "
            "rope_type default, then pos/scaling=<method> for its evaluation"
        )
    extra = sorted(set(params) - READ_KEYS - {"type"})
    if extra:
        raise ConfigError(f"{layer_type}: rope_parameters key {extra[0]!r} has no posbench form for rope_type default")
    base, fraction = float(params.get("rope_theta", 10000.0)), float(params.get("partial_rotary_factor", 1.0))
    return f"rope(base={base!r},{f'fraction={fraction!r},' if fraction != 1 else ''}layout=half)"


def read_config(config) -> Layers:
    """``read`` for a transformers config: a config.json path, a folder holding one, a dict, or a config object."""
    if isinstance(config, (str, Path)):
        from harness.pretrained.folder import read_config as read_typed

        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
        integrity.check_file(path, "export the model again (export=hf) or download its hf_model/ again")
        config = read_typed(path).as_dict()  # every field it reads typed and ranged (harness/pretrained/folder.py)
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    layers = get("num_hidden_layers")
    if layers is None:
        raise ConfigError("the config has no num_hidden_layers; give a transformers decoder's config.json")
    window = None if get("use_sliding_window") is False else get("sliding_window")  # Qwen2's: kept, not applied
    return read(of_config(config), get("layer_types"), int(layers), window)


def of_config(config) -> dict:
    """A copy of the config's ``rope_parameters`` (a dict or an object with attributes), as transformers'
    ``convert_rope_params_to_dict`` and ``standardize_rope_params`` complete it: a v4 config's rope_scaling (``type``,
    v4's name for rope_type; Gemma 3's rope_local_base_freq, the θ of its sliding-attention layers); each flat set
    (the one, or each layer type's) takes the config's rope_theta and partial_rotary_factor where it gives none.
    A rope_type other than default is refused by ``_entry`` and read by ``rotary.scaling_of``."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    params = get("rope_parameters")
    if params is None:  # v4
        params = dict(get("rope_scaling") or {})
        params["rope_type"] = params.pop("rope_type", params.pop("type", "default"))
        local = get("rope_local_base_freq")
        if local is not None:  # Gemma 3's: rope_theta and rope_scaling are its full-attention layers'
            sliding = {"rope_type": "default", "rope_theta": local}
            params = {"full_attention": params, "sliding_attention": sliding}
    if per_layer_type(params):  # each layer type's entry takes the config's two keys, as a flat one does
        return {t: None if p is None else _with_config_keys(dict(p), get) for t, p in params.items()}
    params = _with_config_keys(dict(params), get)
    # Phi-3 keeps its pretraining length beside its rope parameters, and transformers takes that one for the
    # rope types scaled from it
    if get("original_max_position_embeddings") and params.get("rope_type", params.get("type")) in SCALED_FROM:
        params["original_max_position_embeddings"] = get("original_max_position_embeddings")
    return params


def _with_config_keys(params: dict, get) -> dict:
    """``params`` with the config's rope_theta (10000 where it has none) and partial_rotary_factor where they give
    none; GPT-NeoX's config names them rotary_emb_base and rotary_pct, which transformers reads as these."""
    params.setdefault("rope_theta", get("rope_theta") or get("rotary_emb_base") or 10000.0)
    fraction = get("partial_rotary_factor") if get("partial_rotary_factor") is not None else get("rotary_pct")
    if fraction is not None:
        params.setdefault("partial_rotary_factor", fraction)
    return params


def per_layer_type(params: dict) -> bool:
    """Whether a v5 ``rope_parameters`` is nested by layer type (``{"full_attention": {...}, ...}``, a type's
    entry may be null) rather than one flat set of keys."""
    return "rope_theta" not in params and all(isinstance(v, dict) or v is None for v in params.values())


def write(layers: Sequence[tuple[PositionalScheme, AttentionVariant]]) -> tuple[dict, list[str]]:
    """(rope_parameters, layer_types) of a posbench model from its layers' (scheme, variant) pairs: flat when every
    layer's RoPE is the same, else nested by layer type. The RoPE trained with is written; an evaluation-time
    scaling (pos.scaling) is not part of the model. Schemes other than RoPE and NoPE, RoPE options the format
    has no key for, and variants other than softmax and local are refused with the reason."""
    per_type: dict[str, dict | None] = {}
    types, params = [], []
    for i, (scheme, variant) in enumerate(layers):
        layer_type = TYPE_OF_ATTN.get(variant.config_name())
        if layer_type is None:
            raise ConfigError(
                f"layer {i}: attn={variant.config_name()} has no transformers layer type "
                f"(known: {', '.join(TYPE_OF_ATTN)})"
            )
        p = _params(scheme, i)
        if per_type.setdefault(layer_type, p) != p:  # the first layer of its type set it
            raise ConfigError(
                f"layer {i}: two {layer_type} layers with different RoPE settings; rope_parameters "
                "holds one per layer type"
            )
        types.append(layer_type)
        params.append(p)
    if all(p == params[0] for p in params) and params[0] is not None:
        return dict(params[0]), types
    return per_type, types


def _params(scheme, layer: int) -> dict | None:
    name = scheme.config_name()
    if name == "none":
        return None
    if name != "rope":
        raise ConfigError(f"layer {layer}: pos={name} has no transformers rope_parameters form (rope and none do)")
    refused = [k for k in ("resonance", "hope", "randomize", "rotate_heads") if getattr(scheme, k, None)]
    if refused:
        raise ConfigError(f"layer {layer}: pos.{refused[0]} has no key in transformers' rope_parameters")
    return {
        "rope_type": "default",
        "rope_theta": float(scheme.base),
        **({"partial_rotary_factor": float(scheme.fraction)} if scheme.fraction != 1.0 else {}),
    }
