"""xPos, RoPE with an exponential decay (Sun et al. 2022, "A Length-Extrapolatable Transformer", §3).

RoPE's rotation (positional/rope.py) times a per-frequency scale: pair i of a query at position n is
rotated by n·θ_i and multiplied by ζ_i^(n/B), pair i of a key at position m by m·θ_i and ζ_i^(−m/B),

    ζ_i = (2i + γD) / ((1 + γ)D),   i = 0 … D/2−1,   γ = 0.4 (``gamma``),  B = 512 (``scale_base``),

so the logit of a pair carries ζ_i^((n−m)/B): it decays with distance to the past (ζ_i < 1), the high
frequencies (small i, ζ_i near γ/(1+γ)) fastest. A scale commutes with a rotation of its own pair, so
the q and k maps are RoPE rotations whose cos, sin already hold the scale: two ``Rotation`` objects,
applied by rope.py's own code, as cheap per layer as RoPE.

Centring: ζ^(n/B) alone over- or underflows for long inputs (ζ_0^(n/B) ≈ 0.29^(n/512)), so, as
torchscale's XPOS and x-transformers do, exponents use n − c, with c = ⌊L/2⌋ for L the positions training
shows (data.seq_len, or max_position when randomized): the middle of a training input, x-transformers' ⌊T/2⌋
there. c cancels exactly in every logit, ζ^((n−c)/B)·ζ^(−(m−c)/B) = ζ^((n−m)/B), and keeps |q|, |k| within
ζ_0^(∓L/2B) at the training length. It is fixed, not the middle of each input: kernelized attention applies φ
to the scaled q and k, where nothing cancels c, so a centre read from the input would move every output with
the input's length (a causal prefix with what follows it, a padded row with its padding).

Bidirectional (MLM): the same maps. Keys after the query (m > n) then get ζ^(−(m−n)/B) > 1, a growth
with distance instead of a decay (bounded by ζ_0^(−T/B): 1.37 at T = 128, 150 at T = 2048). The paper
trains causal LMs only and x-transformers refuses xPos without a causal mask; here it runs and this is
what it computes.

Notation: T positions, D head dim, W width of the rotated vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.ranges import Positive, ranged
from positional.base import PositionalScheme, Rotary, Shape
from positional.rope import LAYOUTS, Layout, Rotation, rope_angles, rope_inv_freq


def xpos_zeta(width: int, gamma: float, dtype=torch.float64, device=None) -> Tensor:
    """ζ_i = (2i + γW) / ((1 + γ)W) for i = 0 … W/2−1 (Sun et al. 2022, §3). Shape (W/2,)."""
    two_i = torch.arange(0, width, 2, dtype=dtype, device=device)
    return (two_i + gamma * width) / ((1 + gamma) * width)


def _xpos_scale(positions: Tensor, zeta: Tensor, scale_base: float, centre: int) -> Tensor:
    """ζ_i^((n − c)/B) for every position n and frequency i, c = ``centre`` (module doc). Shape (T, W/2), or
    (B, 1, T, W/2) for positions per row (broadcast over heads, as ``rope_angles``)."""
    power = (positions - centre).to(zeta.dtype) / scale_base  # (T,) or (B, T)
    scale = zeta ** power[..., None]
    return scale if positions.dim() == 1 else scale.unsqueeze(-3)


@dataclass(frozen=True)
class XPosRotation(Rotary):
    """Queries and keys get different maps; there is no single ``rotate``."""

    q: Rotation  # cos, sin times ζ^((n−c)/B)
    k: Rotation  # cos, sin times ζ^(−(m−c)/B)
    at_width: Callable[[int], XPosRotation]  # the same scheme for a vector of width w (numerator-mode RoPE)

    def rotate(self, x: Tensor) -> Tensor:
        raise TypeError("xPos scales queries and keys differently: call rotate_q or rotate_k")

    def rotate_q(self, x: Tensor) -> Tensor:
        return self.q.rotate(x)

    def rotate_k(self, x: Tensor) -> Tensor:
        return self.k.rotate(x)


class XPos(PositionalScheme):
    @ranged
    def __init__(
        self,
        shape: Shape,
        base: Positive = 10000.0,
        gamma: Positive = 0.4,
        scale_base: Positive = 512.0,
        layout: Layout = "interleaved",
    ):
        super().__init__(shape)
        if shape.head_dim % 2:
            raise ConfigError(
                f"pos=xpos rotates pairs of dims but the head dim {shape.head_dim} is odd; make "
                "d_model / n_heads (model.d_model / model.n_heads) even"
            )
        self.base, self.gamma, self.scale_base, self.layout = base, gamma, scale_base, layout

    def rotary(self, positions: Tensor) -> XPosRotation:
        return self._rotation(positions, self.shape.head_dim)  # once per forward, shared by all layers

    def _rotation(self, positions: Tensor, width: int) -> XPosRotation:
        # float64, as pos=rope: angles and ζ^(±n/B) stay accurate at long lengths; Rotation casts once
        angles = rope_angles(positions, rope_inv_freq(width, self.base, torch.float64, positions.device))  # (T, W/2)
        zeta = xpos_zeta(width, self.gamma, device=positions.device)
        scale = _xpos_scale(positions, zeta, self.scale_base, self.position_range // 2)  # (T, W/2) or (B, 1, T, W/2)
        cos, sin, apply = angles.cos(), angles.sin(), LAYOUTS[self.layout]
        return XPosRotation(
            q=Rotation(cos * scale, sin * scale, apply=apply, at_width=lambda w: self._rotation(positions, w).q),
            k=Rotation(cos / scale, sin / scale, apply=apply, at_width=lambda w: self._rotation(positions, w).k),
            at_width=lambda w: self._rotation(positions, w),
        )
