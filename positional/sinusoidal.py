"""Fixed sinusoidal absolute positions (Vaswani et al. 2017, §3.5):

    PE(m, 2i)   = sin(m / 10000^(2i/C))
    PE(m, 2i+1) = cos(m / 10000^(2i/C))

added to the token embeddings, which are first multiplied by √C (§3.4: "In the embedding layers,
we multiply those weights by √d_model"): x = √C·E[token] + PE. Without that factor a table of
amplitude 1 swamps embeddings initialised at std 0.02 (BERT's), and at toy scale the model barely
learns (CLM at T = 64 stayed at 3.31 nats while pos=none reached 2.67); ``scale_embeddings: false``
gives the unscaled sum. Computed from the positions each call, so any length works.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.ranges import Positive, ranged
from positional.base import PositionalScheme, Shape


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """(T,) positions -> (T, dim) table ((B, T) -> (B, T, dim)); even columns sin, odd columns cos."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (T, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :dim]  # (T, dim): sin, cos interleaved


class Sinusoidal(PositionalScheme):
    @ranged
    def __init__(self, shape: Shape, base: Positive = 10000.0, scale_embeddings: bool = True):
        super().__init__(shape)
        self.base = base
        self.embed_scale = math.sqrt(shape.d_model) if scale_embeddings else 1.0

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        # (B, T, C) + the table (T, C) or (B, T, C)
        return x * self.embed_scale + sinusoidal_table(positions, x.shape[-1], self.base).to(x.dtype)
