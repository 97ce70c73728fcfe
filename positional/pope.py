"""PoPE (Gopalakrishnan et al. 2025, §3): a_ts = Σ_c softplus(q_c) softplus(k_c) cos((s−t)θ_c + δ_c).

Polar coordinate position embedding ("Decoupling the 'What' and 'Where' With Polar Coordinate Positional
Embeddings", arXiv:2509.10534): a content magnitude and a position phase per component.

Each of the D components of a query (position t) or key (position s) becomes a complex number whose
magnitude is the content, μ = softplus(x_c) ≥ 0, and whose phase is the position alone, tθ_c (the key's
shifted by a learned δ_c): q̃_tc = μ_q,tc·e^{i tθ_c}, k̃_sc = μ_k,sc·e^{i(sθ_c + δ_c)}, and the score is
a_ts = Re[q̃_tᴴ k̃_s] = Σ_c μ_q μ_k cos((s − t)θ_c + δ_c): a function of s − t, unlike RoPE's, whose phase
mixes in the content's own angle. There are D frequencies, one per component (not RoPE's D/2),
θ_c = base^(−c/D), c = 0 … D−1. δ_c ∈ [−2π, 0] (clamped in every forward, initialised at 0) is learned per head
and frequency and, the positional hook being shared by every layer, shared by the layers (as
x-transformers' ``PolarEmbedding``, which this module matches to float rounding: tests/unit/test_pos_pope.py).

``rotary`` returns the real form of q̃, k̃, [μ cos φ | μ sin φ] (B, H, T, 2D), so that q̃ᵀk̃ = a_ts: a map that
widens q and k (``rotary_widens``). Only attention variants whose forward takes the dot product of whatever
width it is handed take it (``AttentionVariant.wide_rotary_refusal``); the others refuse the pairing. Those
variants divide the logits by √(width of q) = √(2D); the query features carry a factor √2, so the logits are
a_ts/√D, the usual 1/√D of the head dim (x-transformers' scale).

Notation: B batch, H heads, T positions, D head dim (= the number of frequencies).
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.ranges import Range, ranged
from positional.base import PositionalScheme, Rotary, Shape
from positional.rope import rope_angles


def pope_inv_freq(head_dim: int, base: float, dtype=torch.float64, device=None) -> Tensor:
    """θ_c = base^(−c/D), c = 0 … D−1: one frequency per component (PoPE §3; θ_c = base^(−(c−1)/d), c = 1 … d).
    Shape (D,)."""
    return base ** (-torch.arange(head_dim, dtype=dtype, device=device) / head_dim)


def _polar_features(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """[μ cos φ | μ sin φ] with μ = softplus(x): the real and imaginary parts of μ·e^{iφ} (PoPE §3).
    x: (B, H, T, D); cos, sin of the phases φ: broadcastable to it. Returns (B, H, T, 2D)."""
    mu = F.softplus(x)
    return torch.cat((mu * cos, mu * sin), dim=-1)


class PolarRotary(Rotary):
    """q ↦ √2·[μ cos tθ | μ sin tθ], k ↦ [μ cos(sθ + δ) | μ sin(sθ + δ)]: (B, H, T, D) -> (B, H, T, 2D)."""

    widens = True

    def __init__(self, cos: Tensor, sin: Tensor, cos_delta: Tensor, sin_delta: Tensor):
        self.cos, self.sin = cos, sin  # (T, D) float64, cos tθ and sin tθ
        self.cos_delta, self.sin_delta = cos_delta, sin_delta  # (H, 1, D), cos δ and sin δ
        self._cast: dict = {}  # dtype -> tables, built once per forward and shared by every layer

    def _tables(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if dtype not in self._cast:
            c, s = self.cos.to(dtype), self.sin.to(dtype)
            cd, sd = self.cos_delta.to(dtype), self.sin_delta.to(dtype)
            # cos(a + δ) = cos a cos δ − sin a sin δ: the phase tθ stays float64-exact at any length
            self._cast[dtype] = (c * math.sqrt(2), s * math.sqrt(2), c * cd - s * sd, s * cd + c * sd)  # (H, T, D)
        return self._cast[dtype]

    def rotate_q(self, x: Tensor) -> Tensor:
        return _polar_features(x, *self._tables(x.dtype)[:2])  # (B, H, T, 2D): √2·cos tθ, √2·sin tθ

    def rotate_k(self, x: Tensor) -> Tensor:
        return _polar_features(x, *self._tables(x.dtype)[2:])  # (B, H, T, 2D): cos(sθ + δ), sin(sθ + δ)

    def rotate(self, x: Tensor) -> Tensor:
        raise TypeError("PoPE maps queries and keys differently (the key's phase carries δ): use rotate_q / rotate_k")


class PoPE(PositionalScheme):
    inv_freq: Tensor  # (D,) θ_c, a buffer
    rotary_widens = True
    float64_state = ("inv_freq",)  # θ_c: the phases tθ_c stay float64-exact in a bf16 model

    @ranged
    def __init__(
        self,
        shape: Shape,
        base: Annotated[float, Range("a positive finite number (θ_c = base^(−c/D))", gt=0)] = 10000.0,
        phase_bias: bool = True,
    ):
        """``phase_bias``: learn δ (H, D); false fixes δ = 0, a_ts = Σ_c μ_q μ_k cos((s − t)θ_c)."""
        super().__init__(shape)
        self.base, self.phase_bias = base, phase_bias
        self.register_buffer("inv_freq", pope_inv_freq(shape.head_dim, base), persistent=False)  # (D,) float64
        # δ held flat, (H·D,): a bias, so the optimizer's 1-D rule keeps it out of weight decay (decay would pull
        # every phase towards 0, the initialisation)
        self.delta = nn.Parameter(torch.zeros(shape.n_heads * shape.head_dim)) if phase_bias else None

    def phase_shift(self) -> Tensor:
        """δ (H, D), clamped to [−2π, 0] (PoPE §3); zeros without ``phase_bias``."""
        h, d = self.shape.n_heads, self.shape.head_dim
        if self.delta is None:
            return self.inv_freq.new_zeros(h, d)
        return self.delta.view(h, d).clamp(-2 * math.pi, 0.0)

    def rotary(self, positions: Tensor) -> PolarRotary:
        angles = rope_angles(positions, self.inv_freq)  # (T, D) float64: the phases tθ_c, (B, 1, T, D) per row
        delta = self.phase_shift()[:, None, :]  # (H, 1, D)
        return PolarRotary(angles.cos(), angles.sin(), delta.cos(), delta.sin())
