"""A model folder as input: config.json, the weights' headers and the tokenizer, typed and checked before a weight is
loaded, each refusal one line naming the file and the field.

- ``config.json``: the fields posbench reads (``HFConfig``, transformers' names), each typed and ranged by its
  annotation, and ``rope_parameters`` (flat, or one per layer type, transformers v5; ``rope_scaling``, v4's name)
  with a known ``rope_type`` and finite, positive numbers;
- the weights: each safetensors file's header (its length, its JSON, every tensor's dtype, shape and offsets within
  the file: a truncated or damaged file is found without reading its data), the input embedding's shape against
  ``vocab_size × hidden_size``; ``pytorch_model.bin`` is taken as it is;
- the tokenizer: ``tokenizer.json`` parses; a posbench export of a byte-level model needs none;
- the family: ``model_type`` one transformers builds as a causal LM (where transformers is installed);
- a posbench export (``posbench_tokenizer`` in its config) carries ``.sha256`` seals: a changed byte is refused, and
  an export without them is said to be unverified.
A weight that is NaN or infinite is refused once the model is loaded (``check_finite``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from harness import integrity
from harness.errors import ConfigError, one_line
from harness.ranges import Fraction, PositiveInt, Range, check_fields, field_hints

if TYPE_CHECKING:
    import torch

MAX_LAYERS = 10_000  # no decoder has more; a typo's 100000000 would make every per-layer list that long
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")  # transformers' ROPE_INIT_FUNCTIONS
LAYER_TYPES = ("full_attention", "sliding_attention")
DTYPES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}  # safetensors' dtypes and their bytes
EMBEDDINGS = ("embed_tokens.weight", "embed_in.weight", "wte.weight", "word_embeddings.weight")
FIX = "re-save the model with save_pretrained, or export it again (export=hf)"
SEALED = "export the model again (export=hf) or download its hf_model/ artifact again"  # a posbench export's fix

Theta = Annotated[float, Range("a positive finite number", gt=0)]
Layers = Annotated[PositiveInt, Range(f"at most {MAX_LAYERS:,} (no decoder has more)", le=MAX_LAYERS)]


@dataclass(frozen=True)
class HFConfig:
    """The fields of a transformers config.json the commands read (hf-eval's budget and scalings, hf-rope)."""

    model_type: str | None = None
    vocab_size: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    num_hidden_layers: Layers | None = None
    num_attention_heads: PositiveInt | None = None
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    qk_rope_head_dim: PositiveInt | None = None  # DeepSeek's latent attention: the rotated part of each head
    intermediate_size: PositiveInt | None = None
    max_position_embeddings: PositiveInt | None = None
    original_max_position_embeddings: PositiveInt | None = None  # Phi-3's, beside rope_scaling
    rope_theta: Theta | None = None
    partial_rotary_factor: Fraction | None = None
    rotary_emb_base: Theta | None = None  # GPT-NeoX's name for rope_theta
    rotary_pct: Fraction | None = None  # GPT-NeoX's name for partial_rotary_factor
    rope_local_base_freq: Theta | None = None  # Gemma 3's v4 θ of its sliding-attention layers
    rope_parameters: dict | None = None  # flat, or one (or None: no RoPE) per layer type: ``rope_parameters``
    rope_scaling: dict | None = None  # transformers v4's name for a scaling's parameters
    layer_types: list[str] | None = None
    sliding_window: PositiveInt | None = None
    use_sliding_window: bool | None = None  # Qwen2's: false keeps sliding_window in the config unused
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    mlp_bias: bool | None = None
    posbench_tokenizer: str | None = None  # a posbench export's tokenizer option (it writes tokenizer.json too)

    def __post_init__(self):
        check_fields(self, "")
        heads, width = self.num_attention_heads, self.hidden_size
        if heads and width and self.head_dim is None and width % heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}, and no head_dim is given"
            )
        if heads and self.num_key_value_heads and heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.layer_types is not None:
            unknown = [t for t in self.layer_types if t not in LAYER_TYPES]
            if unknown or len(self.layer_types) != (self.num_hidden_layers or len(self.layer_types)):
                raise ConfigError(
                    f"layer_types must list one of {', '.join(LAYER_TYPES)} per layer "
                    f"({self.num_hidden_layers}); it has {len(self.layer_types)}"
                    f"{f', with {unknown[0]!r}' if unknown else ''}"
                )
        for key, params in (("rope_parameters", self.rope_parameters), ("rope_scaling", self.rope_scaling)):
            if params is not None:
                _check_rope(key, params, self.layer_types)

    def as_dict(self) -> dict:
        """The fields given, as config.json names them (cost.py reads them)."""
        return {k: v for k, v in vars(self).items() if v is not None}


def _check_rope(key: str, params: dict, layer_types: list[str] | None) -> None:
    """Flat (one dict for every layer) or nested by layer type (a dict or None per type)."""
    types = set(layer_types or []) | set(LAYER_TYPES)
    nested = bool(params) and all(k in types for k in params)
    for where, entry in params.items() if nested else [(None, params)]:
        at = f"{key}.{where}" if where else key
        if entry is None and where:
            continue  # a layer type without RoPE
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}={entry!r} must be a mapping (rope_type, rope_theta, …), or one per layer type")
        kind = entry.get("rope_type", entry.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise ConfigError(
                f"{at}.rope_type={kind!r} is no rope type transformers knows; use one of {', '.join(ROPE_TYPES)}"
            )
        for name in (
            "rope_theta",
            "factor",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "partial_rotary_factor",
            "original_max_position_embeddings",
            "low_freq_factor",
            "high_freq_factor",
        ):
            value = entry.get(name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
                or (name == "partial_rotary_factor" and value > 1)
            ):
                rule = "a number in (0, 1]" if name == "partial_rotary_factor" else "a positive finite number"
                raise ConfigError(f"{at}.{name}={value!r} must be {rule}")
        # longrope's factor may be left out: transformers takes max_position_embeddings / the original (Phi-3's)
        if kind not in ("default", "longrope") and entry.get("factor") is None:
            raise ConfigError(f"{at}: rope_type={kind!r} needs its factor")


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    config: HFConfig
    sealed: bool  # a posbench export whose seals were checked


def read_config(path: Path) -> HFConfig:
    """config.json (a file, or a folder holding one) as an ``HFConfig`` (transformers reads the rest)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file} does not exist; give a transformers config.json or the folder holding one") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file} is not readable JSON ({type(e).__name__}: {one_line(e)[:80]}); {FIX}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file} holds {type(raw).__name__}, not a transformers config (an object); {FIX}")
    raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw  # a multimodal config
    try:
        return HFConfig(**{k: raw[k] for k in field_hints(HFConfig) if k in raw})
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}; fix that field, or {FIX}") from None


def read(folder: Path, contents: bool = True) -> ModelFolder:
    """The folder's config (its seal first, if it has one) and family, one transformers builds as a causal LM
    (unchecked without transformers: the load says which extra), and, with ``contents``, its weights' headers (their
    seal first) and its tokenizer, checked."""
    is_sealed = integrity.check_file(folder / "config.json", SEALED)
    config = read_config(folder)
    if importlib.util.find_spec("transformers") is not None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ConfigError(
                f"{folder}/config.json: model_type={config.model_type!r} is no causal LM transformers builds; "
                "give a decoder's folder (llama, mistral, qwen2, gpt_neox, …)"
            )
    if contents:
        is_sealed = integrity.check_file(folder / "model.safetensors", SEALED) and is_sealed
        _check_weights(folder, config)
        is_sealed = _check_tokenizer(folder) and is_sealed
    return ModelFolder(folder, config, is_sealed)


def unverified(folder: ModelFolder) -> str | None:
    """A note for a posbench export whose seals are gone: its bytes are not known to be the export's."""
    if folder.config.posbench_tokenizer is None or folder.sealed:
        return None
    return (
        f"note: {folder.path} is a posbench export without its .sha256 seals: its files are unverified (export "
        "it again to seal them)"
    )


@functools.cache
def tokenizer(path: Path):
    """The folder's tokenizer (a posbench export's too: its tokenizer.json), loaded once."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _check_tokenizer(folder: Path) -> bool:
    """The folder's tokenizer readable (its seal first, where an export wrote one); whether it was sealed."""
    file = folder / "tokenizer.json"
    if not file.exists():
        if not any((folder / f).exists() for f in ("tokenizer_config.json", "tokenizer.model")):
            raise ConfigError(
                f"{folder} holds no tokenizer (tokenizer.json); save the tokenizer beside the model "
                "(tokenizer.save_pretrained), or export a posbench model again (export=hf writes its own)"
            )
        return False
    sealed = integrity.check_file(file, SEALED)
    try:
        if not isinstance(json.loads(file.read_text()), dict):
            raise ValueError("not an object")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(
            f"{file} is not a tokenizers JSON file ({type(e).__name__}); save the tokenizer again "
            "(tokenizer.save_pretrained)"
        ) from None
    return sealed


def _check_weights(folder: Path, config: HFConfig) -> None:
    files = [folder / "model.safetensors"] if (folder / "model.safetensors").exists() else []
    index = folder / "model.safetensors.index.json"
    if not files and index.exists():
        try:
            files = [folder / str(n) for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{index} is no safetensors index ({type(e).__name__}); {FIX}") from None
    if not files:
        if (folder / "pytorch_model.bin").exists():
            return  # a pickle: read by torch when loaded
        raise ConfigError(f"{folder} holds no weights (model.safetensors, its index, or pytorch_model.bin); {FIX}")
    for file in files:
        for name, shape in _header(file).items():
            if name.endswith(EMBEDDINGS) and shape != [config.vocab_size, config.hidden_size]:
                raise ConfigError(
                    f"{file}: {name} is {'×'.join(map(str, shape))}, but config.json says vocab_size "
                    f"× hidden_size = {config.vocab_size}×{config.hidden_size}; {FIX}"
                )


def _header(file: Path) -> dict[str, list[int]]:
    """A safetensors file's tensors and shapes, from its header (8 bytes of length, then JSON), every tensor's
    offsets inside the file: a truncated or damaged file is refused without its data being read."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > min(size - 8, 100 * 2**20):
                raise ValueError(f"its header length {length:,} does not fit its {size:,} bytes")
            header = json.loads(f.read(length))
        data = size - 8 - length
        shapes: dict[str, list[int]] = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            if (
                t["dtype"] not in DTYPES
                or not 0 <= begin <= end <= data
                or end - begin != math.prod(t["shape"]) * DTYPES[t["dtype"]]
            ):
                raise ValueError(
                    f"{name}'s {t['dtype']} {t['shape']} at bytes {begin}…{end} is not in its "
                    f"{data:,} bytes of data (truncated?)"
                )
            shapes[name] = list(t["shape"])
        return shapes
    except FileNotFoundError:
        raise ConfigError(f"{file} is missing; {FIX}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{file} is not a whole safetensors file ({one_line(e)[:160]}); {FIX}") from None


def check_finite(model: torch.nn.Module, folder: Path) -> None:
    """Every weight finite once loaded (a NaN or inf written into the file is found here, not as NaN losses)."""
    import torch

    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise ConfigError(
                f"{folder}: weight {name} holds {int((~torch.isfinite(p)).sum()):,} NaN or infinite values; the "
                f"weights are damaged: {FIX}"
            )
