"""ALiBi, attention with linear biases (Press et al. 2022, ICLR, "Train Short, Test Long", §3).

b_ij = −m_h · (i − j) for causal LM (the paper's form; the mask hides j > i), and the
symmetric −m_h · |i − j| for bidirectional MLM. No parameters; the head slopes m_h are a
geometric sequence (``alibi_slopes``). The bias depends on i − j only: a ``RelativeBias`` (on p_i − p_j
under randomized positions: a ``PositionalBias``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from positional.base import FarField, LogitBias, PositionalScheme, Shape, bias_over_offsets


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes m_h (Press et al. 2022, §3 and the paper's reference code). Shape (H,), float64.

    For H a power of two: m_h = 2^(−8h/H), h = 1 … H (starting at 2^(−8/H), ratio 2^(−8/H)).
    Otherwise take the 2^⌊log2 H⌋ slopes of the closest power of two below, then the first
    H − 2^⌊log2 H⌋ of every other slope (h = 1, 3, 5, …) of the set for twice that power.
    """

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    low = 1 << (n_heads.bit_length() - 1)  # closest power of two ≤ H
    return torch.tensor(geometric(low) + geometric(2 * low)[0::2][: n_heads - low], dtype=torch.float64)


class ALiBi(PositionalScheme):
    slopes: Tensor  # (H,) m_h, a buffer
    bias_kind = "relative"
    bias_depends_on_layer = False  # the same slopes in every layer (Press et al. 2022, §3)

    def __init__(self, shape: Shape):
        super().__init__(shape)
        self.register_buffer("slopes", alibi_slopes(shape.n_heads), persistent=False)  # (H,) float64, cast by the mask

    def logit_bias(self, positions: Tensor, layer: int) -> LogitBias:
        offsets = self.offsets(positions).to(self.slopes.dtype)  # (2S−1,) p_i − p_j; S = T unless randomized
        distance = offsets if self.shape.causal else offsets.abs()
        # linear in |i − j| from 0 on: slope m_h for past keys, and ∓m_h for future ones (causal: −m_h·(i − j))
        far = FarField(0, torch.stack([self.slopes, -self.slopes if self.shape.causal else self.slopes]))
        return bias_over_offsets(-self.slopes[:, None] * distance[None, :], positions, far)  # table (H, 2S−1)
