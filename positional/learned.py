"""Learned absolute position embeddings (BERT, Devlin et al. 2019, §3; GPT).

One trainable vector per position up to ``shape.max_len`` (``pos.max_position`` with randomized
positions, Ruoss et al. 2023), added to the token
embeddings. Rule beyond the table: **refuse** — a learned table has nothing to say
about positions it never saw, and silently clamping would hide that from a
length-extrapolation result.
"""

from __future__ import annotations

from torch import Tensor, nn

from harness.errors import ConfigError
from positional.base import PositionalScheme, Shape


class Learned(PositionalScheme):
    def __init__(self, shape: Shape, init_std: float = 0.02, randomize: bool = False,
                 max_position: int | None = None):
        super().__init__(shape, randomize=randomize, max_position=max_position)
        self.table = nn.Embedding(self.position_range, shape.d_model)  # data.seq_len, or pos.max_position if randomized
        nn.init.normal_(self.table.weight, std=init_std)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if int(positions.max()) >= self.table.num_embeddings:
            raise ConfigError(
                f"pos=learned has {self.table.num_embeddings} positions but the input needs "
                f"{int(positions.max()) + 1}; train with a longer data.seq_len (or pos.randomize=true with a "
                "larger pos.max_position) or use a relative scheme"
            )
        return x + self.table(positions)  # (B, T, C) + (T, C)
