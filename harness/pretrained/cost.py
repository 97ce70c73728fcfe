"""What ``posbench hf-eval`` will cost, read from the model's config.json before a weight is loaded: parameters
(exact for the Llama / Mistral / Qwen2 / Qwen3 / SmolLM and GPT-NeoX layouts), memory at the longest length and the
FLOPs of every window, passkey prompt and fine-tuning step the sweep runs.

Memory (fp32, the dtype hf-eval loads in; attention through scaled_dot_product_attention, which hf-eval asks for),
for one sequence of L tokens:
  evaluation  weights 4P + logits and their log-softmax 2·L·V·4 + one layer's q, k, v and output 4·h·L·d_h·4 (SDPA's
              fused kernels keep no L × L matrix on a CPU or a GPU, where eager attention keeps h of them) + the
              layer's activations L·(4d + 3f)·4;
  fine-tune   weights, gradients and AdamW's two moments 16P + what backward keeps, per layer L·(16d + 8f)·4,
              + logits, their log-softmax and two gradients 4·L·V·4.
FLOPs of a forward over L tokens: 2·P'·L (P' the parameters a token multiplies: all but the input embedding) +
4·layers·h·d_h·L² (QKᵀ and AV, every pair: no kernel skips the masked half on a CPU); a training step 3× that.

Notation: P parameters, V vocabulary, d hidden size, f MLP width, h query heads, h_kv key/value heads, d_h head dim.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from harness import allocator

GIB = 2.0**30
UNGATED = frozenset({"gpt_neox", "gpt2", "gptj", "falcon", "phi"})  # MLP of two matrices; the rest gate (three)


@dataclass(frozen=True)
class Shapes:
    """The sizes a decoder's parameter count and memory follow from (config.json's names in comments)."""

    vocab: int  # vocab_size
    d: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (default: heads; GPT-NeoX has no grouped keys)
    head_dim: int  # head_dim (default: d / heads)
    mlp: int  # intermediate_size
    gated: bool  # SwiGLU-style gate, up and down projections
    tied: bool  # tie_word_embeddings
    family: str  # model_type

    @classmethod
    def of(cls, config: dict) -> Shapes:
        d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        family = str(config.get("model_type", "llama"))
        return cls(
            vocab=int(config["vocab_size"]),
            d=d,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=heads if family == "gpt_neox" else int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or d // heads),
            mlp=int(config.get("intermediate_size") or 4 * d),
            gated=family not in UNGATED,
            tied=bool(config.get("tie_word_embeddings", family != "gpt_neox")),
            family=family,
        )


def parameter_count(config: dict) -> int:
    """P as transformers builds the model: embeddings, per layer the attention and MLP matrices, their biases and
    norms as each family has them, the final norm and an untied output matrix."""
    s = Shapes.of(config)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = s.d * q + 2 * s.d * kv + q * s.d
    mlp = (3 if s.gated else 2) * s.d * s.mlp
    if s.family == "gpt_neox":  # biases everywhere, LayerNorm weight and bias (two per layer, one at the end)
        per_layer = attention + mlp + (q + 2 * kv + s.d) + (s.mlp + s.d) + 4 * s.d
        final = 2 * s.d
    else:  # RMSNorm weights (Qwen3's also on each head's q and k); Qwen2 and attention_bias=true: biases on q, k, v
        # (Llama's also on o)
        bias = (q + 2 * kv) if s.family == "qwen2" else (q + 2 * kv + s.d) if config.get("attention_bias") else 0
        mlp_bias = ((2 if s.gated else 1) * s.mlp + s.d) if config.get("mlp_bias") else 0
        per_layer = attention + mlp + bias + mlp_bias + 2 * s.d + (2 * s.head_dim if s.family == "qwen3" else 0)
        final = s.d
    return s.vocab * s.d * (1 if s.tied else 2) + s.layers * per_layer + final


def evaluation_bytes(config: dict, length: int) -> dict[str, float]:
    """The peak's parts (bytes, fp32) of a no-grad forward over ``length`` tokens, by what holds them."""
    s = Shapes.of(config)
    return {
        "weights": 4.0 * parameter_count(config),
        "logits": 2.0 * length * s.vocab * 4,
        "attention": 4.0 * s.heads * length * s.head_dim * 4,
        "activations": length * (4.0 * s.d + 3 * s.mlp) * 4,
    }


def finetune_bytes(config: dict, length: int) -> dict[str, float]:
    """The peak's parts (bytes, fp32) of an AdamW step on one sequence of ``length`` tokens."""
    s = Shapes.of(config)
    return {
        "weights, gradients, AdamW": 16.0 * parameter_count(config),
        "logits": 4.0 * length * s.vocab * 4,
        "kept for backward": s.layers * length * (16.0 * s.d + 8 * s.mlp) * 4,
    }


def forward_flops(config: dict, length: int) -> float:
    """FLOPs of one forward over ``length`` tokens (module doc)."""
    s = Shapes.of(config)
    multiplied = parameter_count(config) - s.vocab * s.d * (0 if s.tied else 1)  # tied: the output matrix is used
    return 2.0 * multiplied * length + 4.0 * s.layers * s.heads * s.head_dim * length**2


def available_bytes(device: str = "cpu") -> float:
    """What the device can give now: CUDA's free memory, else the kernel's MemAvailable (harness.allocator), else
    physical RAM."""
    if device == "cuda":
        import torch

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
