"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864).

Each pair of a head's query/key dims at position m is rotated by the angle m·θ_i with
θ_i = base^(−2i/R), i = 0 … R/2−1 (Eq. 15, 0-indexed). The block-diagonal rotation R^d_{Θ,m}
of Eq. 13 is applied in its elementwise form (Eq. 34), so ⟨R_m q, R_n k⟩ depends on m − n
only (Eq. 16). Options:
  layout    interleaved  pairs (x_{2i}, x_{2i+1}), the paper's Eq. 13
            half         pairs (x_i, x_{i+R/2}), GPT-NeoX; the same map up to a fixed permutation
  fraction  partial rotary (GPT-J / GPT-NeoX rotary_pct): only the first R = fraction·D dims
            turn, with θ over R; the other D − R dims pass through
  scaling   eval-time length scaling (positional/rope_scaling.py); training uses plain angles.

``Rotation.at_width(w)`` is "the same scheme for a vector of width w" (kernelized attention
rotates φ(q), φ(k), RoFormer Eq. 19): same layout, base, scaling, and fraction, rotating the
first 2⌊fraction·w/2⌋ dims with θ_i = base^(−2i/R_w) over that rotated width R_w.

Notation: T positions, D head dim, R rotated width, W width of the rotated vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from harness.errors import ConfigError
from positional.base import PositionalScheme, Rotary, Shape
from positional.rope_scaling import RopeScaling, ScaledFrequencies


def rope_inv_freq(head_dim: int, base: float, dtype=torch.float32, device=None) -> Tensor:
    """θ_i = base^(−2i/D) for i = 0 … D/2−1 (RoFormer Eq. 15). Shape (D/2,)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=dtype, device=device) / head_dim)


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """m·θ_i for every position m and frequency i. Shape (T, D/2)."""
    return positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x_{2i}, x_{2i+1}) of x's last dim (RoFormer Eq. 34).

    Written as the complex product (x_{2i} + i·x_{2i+1})·(cos + i·sin) of RoFormer Eq. 12: one
    elementwise pass each way instead of four products, a sum, a difference and a stack (profiled:
    RoPE cost 3.5× more on a d_model 512 step in the real form). Same arithmetic, so same rounding.
    Dtypes without a complex counterpart here (bf16, fp16) take the real form.
    x: (..., T, R); cos, sin: (T, R/2). Returns (..., T, R).
    """
    if x.dtype not in _COMPLEX:
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, R/2) each
        rotated = torch.stack((x_even * cos - x_odd * sin, x_odd * cos + x_even * sin), dim=-1)
        return rotated.flatten(-2)  # (..., T, R): pairs back in place
    if not _pairs_viewable(x):
        x = x.contiguous()
    z = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # (..., T, R/2), a view: no copy
    return torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2)  # (..., T, R)


_COMPLEX = (torch.float32, torch.float64)


def _pairs_viewable(x: Tensor) -> bool:
    """view_as_complex needs unit stride within a pair and even strides/offset elsewhere."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def apply_rope_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+R/2}) (GPT-NeoX layout): apply_rope conjugated by the permutation
    that interleaves the two halves. x: (..., T, R); cos, sin: (T, R/2). Returns (..., T, R)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., T, R/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


LAYOUTS = {"interleaved": apply_rope, "half": apply_rope_half}


def rotated_width(width: int, fraction: float) -> int:
    """The even number of leading dims partial rotary turns: 2⌊fraction·width/2⌋."""
    return 2 * math.floor(fraction * width / 2 + 1e-9)


@dataclass(frozen=True)
class Rotation(Rotary):
    cos: Tensor  # (T, R/2), times the attention scale
    sin: Tensor  # (T, R/2), times the attention scale
    at_width: Callable[[int], "Rotation"]  # the same scheme for a vector of width w (see module doc)
    apply: Callable[[Tensor, Tensor, Tensor], Tensor] = apply_rope
    scale: float = 1.0  # YaRN's √(1/t); also on the pass-through dims so all of q·k is divided by t
    # cos, sin cast to a dtype once per forward, not once per layer and per q and k (dtype -> (cos, sin))
    _cast: dict = field(default_factory=dict, repr=False, compare=False)

    def rotate(self, x: Tensor) -> Tensor:
        """x: (..., T, W) with W ≥ R; the first R dims turn, the rest are only scaled."""
        r = 2 * self.cos.shape[-1]
        if x.dtype not in self._cast:
            self._cast[x.dtype] = (self.cos.to(x.dtype), self.sin.to(x.dtype))
        turned = self.apply(x[..., :r], *self._cast[x.dtype])  # (..., T, R)
        if r == x.shape[-1]:
            return turned
        rest = x[..., r:] if self.scale == 1.0 else x[..., r:] * self.scale
        return torch.cat((turned, rest), dim=-1)  # (..., T, W)


class Rope(PositionalScheme):
    def __init__(self, shape: Shape, base: float = 10000.0, layout: str = "interleaved",
                 fraction: float = 1.0, scaling: str = "none", factor: float = 1.0,
                 alpha: float = 1.0, beta: float = 32.0, original_max_len: int | None = None, **sampling):
        super().__init__(shape, **sampling)
        d, r = shape.head_dim, rotated_width(shape.head_dim, fraction)
        if layout not in LAYOUTS:
            raise ConfigError(f"pos.layout={layout!r}: use {' or '.join(LAYOUTS)}")
        if not 0 < fraction <= 1 or r == 0 or abs(r - fraction * d) > 1e-9:
            raise ConfigError(f"pos={self.config_name()} rotates pairs of dims but pos.fraction × head dim = "
                              f"{fraction} × {d} is not a positive even integer; make model.d_model / "
                              "model.n_heads even or pick a fraction that gives one")
        self.base, self.layout, self.fraction, self.rotated = base, layout, fraction, r
        self.scaling = RopeScaling(scaling, factor, alpha, beta, original_max_len or shape.max_len)
        self._register_theta(rope_inv_freq(self.rotated, base, torch.float64))

    def _register_theta(self, theta0: Tensor) -> None:
        # float64 so angles m·θ stay accurate at long evaluation lengths; rotate() casts cos, sin
        self.register_buffer("inv_freq", theta0, persistent=False)

    def theta_at(self, rotated: int) -> Tensor:
        """θ for a rotated width: the scheme's own θ at its width, base^(−2i/R_w) otherwise."""
        if rotated == self.rotated:
            return self.inv_freq
        return rope_inv_freq(rotated, self.base, self.inv_freq.dtype, self.inv_freq.device)

    def rotary(self, positions: Tensor) -> Rotation:
        return self._rotation(positions, self.shape.head_dim)  # once per forward, shared by all layers

    def _rotation(self, positions: Tensor, width: int) -> Rotation:
        theta = self.theta_at(rotated_width(width, self.fraction))
        # length scaling changes evaluation only; training always sees the plain angles
        f = ScaledFrequencies(theta, 1.0) if self.training else \
            self.scaling.frequencies(theta, int(positions.max()) + 1)
        angles = rope_angles(positions, f.inv_freq)  # (T, R/2)
        s = f.attention_scale
        return Rotation(angles.cos() * s, angles.sin() * s, apply=LAYOUTS[self.layout], scale=s,
                        at_width=lambda w: self._rotation(positions, w))
