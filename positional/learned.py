"""Learned absolute position embeddings (BERT, Devlin et al. 2019, §3; GPT).

One trainable vector per position up to ``shape.max_len``, added to the token
embeddings. Rule beyond the table: **refuse** — a learned table has nothing to say
about positions it never saw, and silently clamping would hide that from a
length-extrapolation result.
"""

from __future__ import annotations

from torch import Tensor, nn

from harness.errors import ConfigError
from positional.base import PositionalScheme, Shape


class Learned(PositionalScheme):
    def __init__(self, shape: Shape, init_std: float = 0.02):
        super().__init__(shape)
        self.table = nn.Embedding(shape.max_len, shape.d_model)
        nn.init.normal_(self.table.weight, std=init_std)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if int(positions.max()) >= self.table.num_embeddings:
            raise ConfigError(
                f"pos=learned has {self.table.num_embeddings} positions but the input needs "
                f"{int(positions.max()) + 1}; train with a longer data.seq_len or use a relative scheme"
            )
        return x + self.table(positions)  # (B, T, C) + (T, C)
