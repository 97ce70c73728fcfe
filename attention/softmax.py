"""Scaled dot-product softmax attention (Vaswani et al. 2017, Eq. 1).

softmax(q kᵀ / √D + b) v, with b the positional logit bias, the key-padding mask and
the causal mask folded into one additive mask. Runs on
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attention.base import AttentionContext, AttentionVariant, additive_mask
from positional.base import Shape


class Softmax(AttentionVariant):
    accepts_bias = frozenset({"relative", "content"})  # any bias: the full logit matrix exists

    def __init__(self, shape: Shape, dropout: float = 0.0):
        super().__init__(shape)
        self.dropout = dropout

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        mask = additive_mask(ctx, q, k)  # computed from the unrotated q, k (content biases use them)
        if ctx.rotary is not None:
            q, k = ctx.rotary.rotate(q), ctx.rotary.rotate(k)
        return F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=ctx.causal and mask is None,
        )  # (B, H, T, D)
