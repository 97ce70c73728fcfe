"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864).

Each adjacent pair (x_{2i}, x_{2i+1}) of a head's query/key at position m is rotated by
the angle m·θ_i with θ_i = base^(−2i/D), i = 0 … D/2−1 (Eq. 15, 0-indexed). The
block-diagonal rotation R^D_{Θ,m} of Eq. 13 is applied in its elementwise form (Eq. 34):

    R x = x ⊙ cos(mθ) + rotate_pairs(x) ⊙ sin(mθ),   rotate_pairs(x)_{2i,2i+1} = (−x_{2i+1}, x_{2i})

so ⟨R_m q, R_n k⟩ depends on m − n only (Eq. 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from harness.errors import ConfigError
from positional.base import PositionalScheme, Shape


def rope_inv_freq(head_dim: int, base: float, dtype=torch.float32, device=None) -> Tensor:
    """θ_i = base^(−2i/D) for i = 0 … D/2−1 (RoFormer Eq. 15). Shape (D/2,)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=dtype, device=device) / head_dim)


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """m·θ_i for every position m and frequency i. Shape (T, D/2)."""
    return positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs of x's last dim (RoFormer Eq. 34).

    x: (..., T, D); cos, sin: (T, D/2). Returns (..., T, D).
    """
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each
    rotated = torch.stack((x_even * cos - x_odd * sin, x_odd * cos + x_even * sin), dim=-1)
    return rotated.flatten(-2)  # (..., T, D): pairs back in place


@dataclass(frozen=True)
class Rotation:
    cos: Tensor  # (T, D/2)
    sin: Tensor  # (T, D/2)
    # The same scheme for vectors of another even width: kernelized attention rotates
    # φ(q), φ(k) of width m ≠ D (RoFormer Eq. 19), with θ_i = base^(−2i/m).
    at_width: Callable[[int], "Rotation"]

    def rotate(self, x: Tensor) -> Tensor:
        """x: (..., T, W) with W = 2 · cos.shape[-1]."""
        return apply_rope(x, self.cos.to(x.dtype), self.sin.to(x.dtype))


class Rope(PositionalScheme):
    def __init__(self, shape: Shape, base: float = 10000.0):
        super().__init__(shape)
        if shape.head_dim % 2:
            raise ConfigError(
                f"pos=rope rotates pairs of dims but the head dim is {shape.head_dim} (odd); "
                "pick model.d_model / model.n_heads even"
            )
        self.base = base
        self.register_buffer("inv_freq", rope_inv_freq(shape.head_dim, base), persistent=False)

    def rotary(self, positions: Tensor) -> Rotation:
        return self._rotation(positions, self.inv_freq)  # once per forward, shared by all layers

    def _rotation(self, positions: Tensor, inv_freq: Tensor) -> Rotation:
        angles = rope_angles(positions, inv_freq)  # (T, W/2)
        return Rotation(angles.cos(), angles.sin(), at_width=lambda w: self._rotation(
            positions, rope_inv_freq(w, self.base, inv_freq.dtype, inv_freq.device)))
