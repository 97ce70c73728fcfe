"""Sliding-window (local) softmax attention, computed blockwise in O(T·w) time and memory.

Window of width w (``attn.window``):
  bidirectional  query i attends keys j with |i − j| ≤ ⌊w/2⌋        (Longformer, Beltagy et al. 2020, §3.1)
  causal         query i attends keys j with i − w < j ≤ i, w keys   (Child et al. 2019 "local" pattern;
                                                                       Mistral's sliding window)
Inside the band it is exactly softmax(q kᵀ/√D + b) v of Vaswani et al. 2017 Eq. 1 with the band
as a mask. Queries are cut into blocks of C; each block sees only its C + ⌊band⌋ neighbouring keys,
so nothing of size T×T is formed.

Biases: a relative (Toeplitz) bias is read from its per-offset table for the offsets in the band.
A content bias is refused: its interface only evaluates ``dense(q, k)`` over every (i, j) pair
with positions implied by the tensors, so a banded evaluation would need a positional hook the
scheme does not offer; materialising T×T would defeat the variant.

Notation: B batch, H heads, T length, D head dim, C query block, K = C + left + right keys per block,
N = ⌈T / C⌉ blocks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import AttentionContext, AttentionVariant, Positioned, count_keys
from attention.softmax import masked_softmax
from harness.errors import IncompatiblePairing
from harness.ranges import PositiveInt, ranged
from positional.base import Shape


def band_limits(window: int, causal: bool) -> tuple[int, int]:
    """(left, right): query i sees keys j with −right ≤ i − j ≤ left."""
    return (window - 1, 0) if causal else (window // 2, window // 2)


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    left: int,
    right: int,
    block: int,
    table: Tensor | None = None,
    key_keep: Tensor | None = None,
) -> Tensor:
    """softmax over the band −right ≤ i − j ≤ left, blockwise.

    q, k: (B, H, T, D); v: (B, H, T, Dv). table: (H, 2T − 1) relative bias, column o ↔ i − j = o − (T − 1).
    key_keep: (B, T) bool, True at real keys. Returns (B, H, T, Dv).
    """
    B, H, T, D = q.shape
    C = block
    n = -(-T // C)
    K, tail = C + left + right, n * C - T
    qb = F.pad(q / math.sqrt(D), (0, 0, 0, tail)).view(B, H, n, C, D)  # (B, H, N, C, D); scaled here, not the logits
    kb = F.pad(k, (0, 0, left, right + tail)).unfold(2, K, C)  # (B, H, N, D, K): block b sees keys bC−left …
    vb = F.pad(v, (0, 0, left, right + tail)).unfold(2, K, C).transpose(-1, -2)  # (B, H, N, K, D)
    logits = qb @ kb  # (B, H, N, C, K)

    a = torch.arange(C, device=q.device)[:, None]  # query offset in its block
    b = torch.arange(K, device=q.device)[None, :]  # key offset in the block's key window
    offset = a - b + left  # (C, K): i − j, the same for every block
    j = torch.arange(n, device=q.device)[:, None, None] * C + b - left  # (N, 1, K) global key index
    keep = (offset >= -right) & (offset <= left) & (j >= 0) & (j < T)  # (N, C, K)
    if key_keep is not None:
        real = F.pad(key_keep, (left, right + tail), value=False).unfold(1, K, C)  # (B, N, K)
        keep = keep & real[:, None, :, None, :]  # (B, 1, N, C, K)
    # the mask as an additive −inf (its backward passes the gradient through; masked_fill's is another pass)
    mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, float("-inf"))
    if table is not None:
        column = (offset + T - 1).clamp(0, 2 * T - 2)  # out-of-band entries are masked
        mask = mask + table[:, column].to(q.dtype)[:, None]  # (H, N, C, K) or, with padding, (B, H, N, C, K)
    logits = logits + mask  # (B, H, N, C, K)
    # torch's fused softmax (masked_softmax's separate amax/sub/exp/sum/div passes weigh on a long local
    # step) unless some row may see no key at all, which only masked_softmax turns into 0 instead of NaN.
    # Decided from shapes, reading no tensor (that would wait for the GPU): without padding, row i sees keys
    # max(0, i − left) … min(T − 1, i + right), none only for a padded tail row i ≥ T + left; with padding,
    # which rows see a key depends on the data, so masked_softmax always
    every_row_sees_a_key = key_keep is None and tail <= left
    weights = torch.softmax(logits, -1) if every_row_sees_a_key else masked_softmax(logits)  # (B, H, N, C, K)
    return (weights @ vb).reshape(B, H, n * C, v.shape[-1])[:, :, :T]  # (B, H, T, Dv): v may be narrower than q


class Local(AttentionVariant):
    accepts_bias = frozenset({"relative"})
    document_mask_refusal = "its blocks of C queries take the causal and padding masks, not one across documents"
    wide_rotary_refusal = None  # the band's q̃ kᵀ/√(width of q) at any width; v keeps the head dim
    bias_refusals = {
        "content": "a content bias is only offered as dense T×T logits, which the O(T·w) band never forms",
        "positional": "a bias that depends on more than i − j (FIRE, or pos.randomize=true) is only "
        "offered as dense T×T logits, which the O(T·w) band never forms",
    }

    @ranged
    def __init__(self, shape: Shape, window: PositiveInt = 32):
        super().__init__(shape)
        if window > shape.max_len:
            raise IncompatiblePairing(
                f"window={window} exceeds the longest sequence ({shape.max_len} tokens: "
                "max_len, i.e. data.seq_len or a task's longest example), so nothing is "
                "local; lower window or use attn=softmax"
            )
        self.window = window
        self.block = max(window, 16)  # query block C ≈ w: K = C + band ≤ 2w + 16 keys per query

    def keys_attended(self, t: int, ctx: AttentionContext, device=None) -> Tensor:
        return count_keys(t, ctx, band_limits(self.window, ctx.causal), device)

    def attend(self, p: Positioned, v: Tensor) -> Tensor:
        bias = p.relative(self.config_name())  # kind "relative" only (accepts_bias)
        left, right = band_limits(self.window, p.ctx.causal)
        table = None if bias is None else bias.table  # (H, 2T − 1)
        return banded_attention(p.q, p.k, v, left, right, min(self.block, p.q.shape[-2]), table, p.ctx.key_padding_mask)

    def weights(self, p: Positioned) -> Tensor:
        """The band's softmax (Longformer §3.1), softmax(q kᵀ/√D + b) over −right ≤ i − j ≤ left, written densely:
        the band applied to v = I (out = w @ v), so exactly 0 outside the band."""
        t_k = p.k.shape[-2]
        identity = torch.eye(t_k, dtype=p.q.dtype, device=p.q.device).expand(*p.q.shape[:2], t_k, t_k)  # (B, H, Tk, Tk)
        return self.attend(p, identity)  # (B, H, Tq, Tk)
