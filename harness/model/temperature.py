"""Length-scaled attention temperature: queries multiplied by a factor that grows with the length attended.

Softmax over n logits flattens as n grows (the largest weight → 0, "attention fading"); scaling the logits by
a factor that grows like log n keeps it sharp at lengths never trained on. Both forms act on the query alone,
q_i ← τ_i · q_i, after the positional scheme's rotation and before the scores, so they compose with every
scheme and every attention variant (a logit bias b_ij is added after q·k and is not scaled; a content bias that
reads q, Transformer-XL's q·r or CoPE's gates, reads the scaled q).

  ssmax   Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv:2501.19399,
          Eq. 2): SSMax(z)_j = n^{s·z_j} / Σ_k n^{s·z_k} = softmax((s·log n)·z)_j, n the number of keys the
          query attends, s a learned scalar per layer and head. Here n_i = i + 1 for query i under causal
          attention (its prefix), min(i + 1, w) under a causal window of w keys, and the number of unpadded keys
          without a causal mask. s starts at 1 / log T_train (``model.temperature_init`` overrides), so training
          starts from plain softmax at its own length; the paper learns s from its own start (its Fig. 1 uses
          s = 0.43 to show the effect).
  llama4  Llama 4's attention temperature tuning (transformers' Llama4TextAttention, ``attn_temperature_tuning``;
          applied there to the NoPE layers only: ``model.temperature_layers=nope``):
          τ_i = 1 + β · log(1 + ⌊(i + 1) / F⌋), i the query's position from 0, F = ``model.temperature_floor``
          (8192 in Llama 4), β = ``model.temperature_scale`` (0.1). Nothing is learned; τ = 1 for i + 1 < F.

Notation: B batch, H heads, T length.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def ssmax_factor(s: Tensor, n: Tensor) -> Tensor:
    """s·log n: s (H,), n (..., T) keys attended -> (..., H, T, 1) after broadcasting n as (..., 1, T)."""
    return (s[:, None] * torch.log(n.to(s.dtype))[..., None, :])[..., None]


def llama4_factor(t: int, floor: int, scale: float, device=None, dtype=torch.float32) -> Tensor:
    """1 + scale·log(1 + ⌊(i + 1)/floor⌋) for i = 0 … t−1: (T, 1)."""
    i = torch.arange(t, device=device, dtype=torch.float64)
    return (1 + scale * torch.log1p(torch.floor((i + 1) / floor))).to(dtype)[:, None]


class LengthTemperature(nn.Module):
    """One layer's τ: ``forward(q, n)`` returns τ·q for q (B, H, T, D) and n, the keys each query attends as the
    layer's attention variant counts them (``AttentionVariant.keys_attended``)."""

    def __init__(self, kind: str, n_heads: int, max_len: int, init: float | None, floor: int, scale: float):
        super().__init__()
        self.kind, self.floor, self.scale = kind, floor, scale
        if kind == "ssmax":
            s0 = init if init is not None else 1.0 / math.log(max(max_len, 2))
            self.s = nn.Parameter(torch.full((n_heads,), float(s0)))

    def forward(self, q: Tensor, n: Tensor) -> Tensor:
        if self.kind == "ssmax":
            return q * ssmax_factor(self.s, n).to(q.dtype)
        return q * llama4_factor(q.shape[-2], self.floor, self.scale, q.device, q.dtype)

    def extra_repr(self) -> str:
        return self.kind
