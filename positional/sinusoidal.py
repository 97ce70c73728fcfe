"""Fixed sinusoidal absolute positions (Vaswani et al. 2017, §3.5):

    PE(m, 2i)   = sin(m / 10000^(2i/C))
    PE(m, 2i+1) = cos(m / 10000^(2i/C))

added to the token embeddings. Computed from the positions each call, so any length works.
"""

from __future__ import annotations

import torch
from torch import Tensor

from positional.base import PositionalScheme, Shape


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """(T,) positions -> (T, dim) table; even columns sin, odd columns cos."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (T, dim/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (T, dim): sin, cos interleaved
    return table[:, :dim]


class Sinusoidal(PositionalScheme):
    def __init__(self, shape: Shape, base: float = 10000.0):
        super().__init__(shape)
        self.base = base

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + sinusoidal_table(positions, x.shape[-1], self.base).to(x.dtype)  # (B, T, C)
