"""p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings
useful?", §6): RoPE with its lowest frequencies removed.

RoPE's frequencies θ_i = base^(−2i/D), i = 0 … D/2−1 (RoFormer Eq. 15), are kept for the k = ⌊p·D/2⌋
highest ones (i < k) and set to 0 for the rest, whose pairs are then not rotated at all:

    θ'_i = base^(−2i/D)  for i < k,     θ'_i = 0  for i ≥ k.

p = 1 is RoPE, p = 0 no position (the model equals pos=none: ``rotary`` returns None). The paper's
argument: the lowest frequencies turn so slowly that they act as position-independent "semantic"
channels which RoPE still perturbs over long inputs; removing them keeps those channels clean.

Not partial rotary (pos=rope ``fraction``, GPT-J / GPT-NeoX ``rotary_pct``): partial rotary turns the
first R = fraction·D dims with θ_i = base^(−2i/R), i.e. the whole range from 1 down to ~1/base squeezed
into R/2 pairs; p-RoPE keeps the original θ_i = base^(−2i/D) of the k fastest pairs, whose slowest is
base^(−2(k−1)/D) ≫ 1/base. E.g. D = 64, p = fraction = 0.25: both rotate 8 pairs, partial rotary's
slowest at 10⁴^(−14/16) ≈ 3·10⁻⁴ rad/token, p-RoPE's at 10⁴^(−14/64) ≈ 0.13.

This is Hugging Face's ``proportional`` rope type (``ROPE_INIT_FUNCTIONS["proportional"]``, with
``partial_rotary_factor`` = p), and k = ⌊p·D/2⌋ is its rounding. The whole vector goes through RoPE's
rotation with cos = 1, sin = 0 on the removed pairs, which leaves them exactly unchanged: a step costs
what a RoPE step costs. (Rotating only the k leading pairs of the interleaved layout and passing the
rest through, as partial rotary does, is slower per rotation: the slice and the concatenation, forward
and backward, cost more than the rotation they save.)

Notation: T positions, D head dim, W width of the rotated vector, k kept pairs.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.ranges import Range, ranged
from positional.base import PositionalScheme, Shape
from positional.rope import LAYOUTS, Base, Layout, Rotation, rope_angles, rope_inv_freq, rotated_width


def p_rope_inv_freq(width: int, p: float, base: float, dtype=torch.float64, device=None) -> Tensor:
    """θ'_i = base^(−2i/W) for i < k = ⌊p·W/2⌋, 0 after (Barbero et al. 2024, §6). Shape (W/2,).

    2k is ``rotated_width(W, p)``, partial rotary's rounding and HF's ``int(partial_rotary_factor * head_dim // 2)``.
    """
    theta = rope_inv_freq(width, base, dtype, device)
    return torch.where(torch.arange(width // 2, device=device) < rotated_width(width, p) // 2, theta, 0.0)


class PRope(PositionalScheme):
    @ranged
    def __init__(
        self,
        shape: Shape,
        p: Annotated[
            float, Range("in [0, 1] (the fraction of RoPE's frequencies kept)", ge=0, le=1, verb="lie")
        ] = 0.25,
        base: Base = 10000.0,
        layout: Layout = "interleaved",
    ):
        super().__init__(shape)
        if shape.head_dim % 2:
            raise ConfigError(
                f"pos=p_rope rotates pairs of dims but the head dim {shape.head_dim} is odd; make "
                "d_model / n_heads (model.d_model / model.n_heads) even"
            )
        self.p, self.base, self.layout = p, base, layout

    def rotary(self, positions: Tensor) -> Rotation | None:
        if rotated_width(self.shape.head_dim, self.p) == 0:
            return None  # no frequency left: no position, exactly pos=none
        return self._rotation(positions, self.shape.head_dim)  # once per forward, shared by all layers

    def _rotation(self, positions: Tensor, width: int) -> Rotation:
        theta = p_rope_inv_freq(width, self.p, self.base, device=positions.device)  # (W/2,) float64, as pos=rope
        angles = rope_angles(positions, theta)  # (T, W/2), 0 on the removed pairs
        return Rotation(
            angles.cos(), angles.sin(), apply=LAYOUTS[self.layout], at_width=lambda w: self._rotation(positions, w)
        )
