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
from harness.ranges import NonNegative, ranged
from positional.base import PositionalScheme, Shape


class Learned(PositionalScheme):
    @ranged
    def __init__(self, shape: Shape, init_std: NonNegative = 0.02):
        super().__init__(shape)
        self.table = nn.Embedding(self.position_range, shape.d_model)  # data.seq_len, or pos.max_position if randomized
        nn.init.normal_(self.table.weight, std=init_std)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        # positions are 0 … T−1, or a sample from [0, max_position) (the table's length): T alone says whether
        # the table covers them, and no position is read (reading one would wait for the GPU)
        if positions.shape[-1] > self.table.num_embeddings:  # restarted per document (B, T): below T too
            raise ConfigError(
                f"pos=learned has {self.table.num_embeddings} positions but the input needs {positions.shape[-1]}; "
                "train with a longer max_len (data.seq_len), or randomize=true with a larger max_position, or use a "
                "relative scheme"
            )
        return x + self.table(positions)  # (B, T, C) + (T, C) or (B, T, C)
