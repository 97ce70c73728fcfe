"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", §3.2).

Kernelized attention (attention/kernelized.py) with the feature map of Eq. 7, φ(x) = elu(x) + 1:
positive, elementwise, M = D. The bidirectional form is Eq. 6, the causal form Eq. 8–9 (chunked
prefix sums, O(T) memory); relative biases and RoPE modes come from the shared machinery.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attention.kernelized import KernelizedAttention


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, Eq. 7): > 0 everywhere. Shape preserved."""
    return F.elu(x) + 1.0


class Linear(KernelizedAttention):
    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        return elu_feature_map(x)  # (B, H, T, D)
