"""Synthetic inputs and explicit O(T²) references for the attention tests (float64 throughout).

The references build every (i, j) weight explicitly and share no code with attention/.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from positional.base import LogitBias, RelativeBias, Shape
from positional.rope import Rope

F64 = torch.float64


def qkv(B=2, H=3, T=37, D=8, seed=0, scale=1.0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(scale * torch.randn(B, H, T, D, generator=g, dtype=F64) for _ in range(3))


def relative_bias(H: int, T: int, seed=1) -> RelativeBias:
    """A random Toeplitz bias per head, as T5 or ALiBi would hand over."""
    g = torch.Generator().manual_seed(seed)
    return RelativeBias(torch.randn(H, 2 * T - 1, generator=g, dtype=F64), T, T)


class ContentBias(LogitBias):
    """b_ij = (q_i · u)(1 + j/T): depends on the query's content and on j."""

    kind = "content"

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        j = torch.arange(k.shape[-2], dtype=q.dtype)
        return q.sum(-1, keepdim=True) * (1 + j / k.shape[-2])  # (B, H, Tq, Tk)


def rotation(T: int, D: int):
    return Rope(Shape(D, 1, 1, T, False)).rotary(torch.arange(T))


def padding(B: int, T: int) -> Tensor:
    """(B, T) bool: row 0 right-padded, row 1 left-padded, others full."""
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[0, T - T // 3 :] = False
    if B > 1:
        keep[1, : T // 4] = False
    return keep


def allowed_pairs(T: int, causal: bool, key_keep: Tensor | None, band: tuple[int, int] | None = None) -> Tensor:
    """(B or 1, 1, T, T) bool: which keys j query i may see."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    ok = torch.ones(T, T, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if band is not None:
        left, right = band
        ok &= (i - j <= left) & (j - i <= right)
    ok = ok[None, None]
    if key_keep is not None:
        ok = ok & key_keep[:, None, None, :]
    return ok


def reference_softmax(q, k, v, *, causal=False, key_keep=None, bias=None, rot=None, band=None) -> Tensor:
    """softmax(q kᵀ/√D + b) v over the allowed pairs; rows with none give 0."""
    logits = (
        q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if rot is None
        else rot.rotate(q) @ rot.rotate(k).transpose(-1, -2) / math.sqrt(q.shape[-1])
    )
    if bias is not None:
        logits = logits + bias.dense(q, k)
    ok = allowed_pairs(q.shape[-2], causal, key_keep, band)
    w = torch.softmax(logits.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
    return w @ v


def rotation_matrices(cos: Tensor, sin: Tensor) -> Tensor:
    """(T, W, W) block-diagonal R_m of RoFormer Eq. 13, entry by entry from cos, sin: (T, W/2)."""
    T, half = cos.shape
    R = torch.zeros(T, 2 * half, 2 * half, dtype=F64)
    for p in range(half):
        c, s = cos[:, p].to(F64), sin[:, p].to(F64)
        R[:, 2 * p, 2 * p], R[:, 2 * p, 2 * p + 1] = c, -s
        R[:, 2 * p + 1, 2 * p], R[:, 2 * p + 1, 2 * p + 1] = s, c
    return R


def reference_kernelized(phi_q, phi_k, v, *, causal=False, key_keep=None, bias=None, num_rot=None) -> Tensor:
    """Σ_j c_ij s_ij v_j / Σ_j c_ij φ(q_i)ᵀφ(k_j) with c_ij = exp(b_ij)·[allowed] and
    s_ij = φ(q_i)ᵀφ(k_j), or (R_i φ(q_i))ᵀ(R_j φ(k_j)) with num_rot = (T, M, M) matrices."""
    den_scores = phi_q @ phi_k.transpose(-1, -2)  # (B, H, T, T)
    num_scores = den_scores
    if num_rot is not None:
        rq = torch.einsum("tmn,bhtn->bhtm", num_rot, phi_q)
        rk = torch.einsum("tmn,bhtn->bhtm", num_rot, phi_k)
        num_scores = rq @ rk.transpose(-1, -2)
    c = allowed_pairs(phi_q.shape[-2], causal, key_keep).to(F64)
    if bias is not None:
        c = c * bias.dense().exp()
    den = (c * den_scores).sum(-1, keepdim=True)
    return (c * num_scores) @ v / torch.where(den > 0, den, 1.0)  # no visible key: 0, as softmax
