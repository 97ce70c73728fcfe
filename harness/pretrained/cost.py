"""What ``posbench hf-eval`` will cost, before a weight is loaded: parameters (the model built on the ``meta``
device from its config.json, as transformers builds it), memory at the longest length and the FLOPs of every window,
passkey prompt and fine-tuning step the sweep runs.

Memory (fp32, the dtype hf-eval loads in; attention through scaled_dot_product_attention, which hf-eval asks for),
for one sequence of L tokens:
  evaluation  weights 4P + logits and their log-softmax 2·L·V·4 + one layer's q, k, v and output 4·h·L·d_h·4 (SDPA's
              fused kernels keep no L × L matrix on a CPU or a GPU, where eager attention keeps h of them) + the
              layer's activations L·(4d + 3f)·4;
  fine-tune   weights, gradients and AdamW's two moments 16P + what backward keeps, per layer L·(16d + 8f)·4,
              + logits, their log-softmax and two gradients 4·L·V·4.
FLOPs of a forward over L tokens: 2·P'·L (P' the parameters a token multiplies: all but the input embedding, and of
a mixture of experts' routed experts the ones a token is sent to) +
4·layers·h·d_h·L² (QKᵀ and AV, every pair: no kernel skips the masked half on a CPU); a training step 3× that.

Notation: P parameters, V vocabulary, d hidden size, f MLP width, h query heads, d_h head dim.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import allocator
from harness.errors import ConfigError, one_line
from harness.extras import require
from harness.pretrained.folder import FIX

GIB = 2.0**30


@dataclass(frozen=True)
class Shapes:
    """The sizes a decoder's memory and FLOPs follow from (config.json's names in comments)."""

    vocab: int  # vocab_size
    d: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    head_dim: int  # head_dim (default: d / heads)
    mlp: int  # intermediate_size

    @classmethod
    def of(cls, config: dict) -> Shapes:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(
            vocab=int(config["vocab_size"]),
            d=d,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            head_dim=int(config.get("head_dim") or d // heads),
            mlp=int(config.get("intermediate_size") or 4 * d),
        )


@functools.cache
def parameters(folder: Path) -> tuple[int, float]:
    """(P, P'): the parameters of the folder's model as transformers builds it, counted on the ``meta`` device (no
    weight is allocated; exact for every family, its norms, biases and experts included), and those one token
    multiplies: all but the input embedding (tied, it is the output matrix too), of a mixture's routed experts only
    the ``num_experts_per_tok`` it is sent to."""
    require("posbench hf-eval", ("transformers",))
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(
            f"{folder}/config.json: transformers builds no model from it ({type(e).__name__}: "
            f"{one_line(e)[:160]}); {FIX}"
        ) from None
    every = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    lookup = 0 if output is not None and output.weight is embedding else embedding.numel()
    text = config.get_text_config()
    experts = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None) or 0
    idle = sum(  # routed experts stacked in one tensor, the expert first (transformers' fused layout)
        p.numel() * (1 - top_k / experts)
        for name, p in model.named_parameters()
        if ".experts." in name and top_k and p.ndim > 1 and p.shape[0] == experts
    )
    return every, every - lookup - idle


def evaluation_bytes(config: dict, length: int, parameters: int) -> dict[str, float]:
    """The peak's parts (bytes, fp32) of a no-grad forward over ``length`` tokens, by what holds them."""
    s = Shapes.of(config)
    return {
        "weights": 4.0 * parameters,
        "logits": 2.0 * length * s.vocab * 4,
        "attention": 4.0 * s.heads * length * s.head_dim * 4,
        "activations": length * (4.0 * s.d + 3 * s.mlp) * 4,
    }


def finetune_bytes(config: dict, length: int, parameters: int) -> dict[str, float]:
    """The peak's parts (bytes, fp32) of an AdamW step on one sequence of ``length`` tokens."""
    s = Shapes.of(config)
    return {
        "weights, gradients, AdamW": 16.0 * parameters,
        "logits": 4.0 * length * s.vocab * 4,
        "kept for backward": s.layers * length * (16.0 * s.d + 8 * s.mlp) * 4,
    }


def forward_flops(config: dict, length: int, multiplied: float) -> float:
    """FLOPs of one forward over ``length`` tokens, ``multiplied`` the parameters a token multiplies (module doc)."""
    s = Shapes.of(config)
    return 2.0 * multiplied * length + 4.0 * s.layers * s.heads * s.head_dim * length**2


def available_bytes(device: str = "cpu") -> float:
    """What the device can give now: CUDA's free memory, else the kernel's MemAvailable (harness.allocator), else
    physical RAM."""
    if device == "cuda":
        return float(torch.cuda.mem_get_info()[0])
    free = allocator.available_bytes()
    return float(free if free is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def describe(parts: dict[str, float]) -> str:
    """'12.3 GiB (weights 10.0, logits 2.0, …)', in MiB below a GiB."""
    unit, size = ("GiB", GIB) if sum(parts.values()) >= GIB else ("MiB", 2.0**20)
    return (
        f"{sum(parts.values()) / size:.1f} {unit} (" + ", ".join(f"{k} {v / size:.2f}" for k, v in parts.items()) + ")"
    )


def hours(flops: float, gflops: float) -> str:
    """The time ``flops`` take at ``gflops`` GFLOP/s, in the unit that reads best."""
    seconds = flops / (gflops * 1e9)
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{math.ceil(seconds / 60)} min" if seconds >= 60 else f"{seconds:.2g} s"
