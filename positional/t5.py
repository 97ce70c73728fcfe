"""T5 relative position bias (Raffel et al. 2020, JMLR, §2.1 "relative position embeddings").

One learned scalar per (bucket, head) is added to the logit b_ij; the bucket of the offset
comes from ``relative_position_bucket`` (the rule of the T5 codebase, mesh_tensorflow
``_relative_position_bucket``): exact buckets for small distances, log-spaced ones up to
``max_distance``, one shared bucket beyond. Bidirectional (MLM) spends half the buckets on
each direction; causal (CLM) spends all of them on the past. The table is shared by all
layers (as in T5) unless ``per_layer``. T5 adds it to unscaled logits; here it is added after
softmax attention's 1/√D, which only changes what the learned scalars have to learn.

Since b_ij depends on i − j only, the bias is a ``RelativeBias`` (a Toeplitz matrix per head); with
randomized positions (pos.randomize) it depends on p_i − p_j and is a ``PositionalBias``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from harness.errors import ConfigError
from harness.ranges import NonNegative, ranged
from positional.base import FarField, LogitBias, PositionalScheme, Shape, bias_over_offsets


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (Raffel et al. 2020, §2.1; T5 codebase rule).

    Args:
        relative_position: long tensor of key position − query position (j − i), T5's sign.
        bidirectional: half the buckets for keys after the query (j > i), half for the rest;
            if False, keys after the query all fall in bucket 0 (the causal mask hides them).
        num_buckets, max_distance: per direction, n = num_buckets (/2 if bidirectional) buckets;
            distances d < n/2 get bucket d, n/2 ≤ d < max_distance get
            n/2 + ⌊log(d/(n/2)) / log(max_distance/(n/2)) · (n − n/2)⌋, the rest bucket n − 1.
    Returns:
        long tensor of the same shape, values in [0, num_buckets).
    """
    distance = -relative_position  # i − j: positive for keys in the past
    if bidirectional:
        num_buckets //= 2
        offset = (distance < 0).long() * num_buckets  # future keys use the upper half
        distance = distance.abs()
    else:
        offset = torch.zeros_like(distance)
        distance = distance.clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < max_exact, distance, large)


class T5Bias(PositionalScheme):
    bias_kind = "relative"

    @ranged
    def __init__(
        self,
        shape: Shape,
        num_buckets: int = 32,
        max_distance: int = 128,
        per_layer: bool = False,
        init_std: NonNegative = 0.02,
    ):
        super().__init__(shape)
        if num_buckets < 4 or num_buckets % 2:
            raise ConfigError(f"num_buckets={num_buckets} must be even and ≥ 4 (half per direction for MLM)")
        if max_distance <= num_buckets // 2:
            raise ConfigError(f"max_distance={max_distance} must exceed num_buckets/2 = {num_buckets // 2}")
        self.num_buckets, self.max_distance, self.per_layer = num_buckets, max_distance, per_layer
        self.bias_depends_on_layer = per_layer  # one table shared by all layers otherwise, as in T5
        tables = (shape.n_layers if per_layer else 1, shape.n_heads, num_buckets)  # (L or 1, H, NB)
        self.bias = nn.Parameter(torch.randn(tables) * init_std)

    def logit_bias(self, positions: Tensor, layer: int) -> LogitBias:
        # over the offsets p_i − p_j, (2S−1,); S = T unless randomized
        buckets = relative_position_bucket(
            -self.offsets(positions), not self.shape.causal, self.num_buckets, self.max_distance
        )
        table = self.bias[layer if self.per_layer else 0]  # (H, NB)
        # from max_distance on, each direction has one bucket (relative_position_bucket): constant
        far = FarField(self.max_distance, table.new_zeros(2, table.shape[0]).detach())
        return bias_over_offsets(table[:, buckets], positions, far)  # table (H, 2S−1) over offsets −(S−1) … S−1
