"""Kernelized attention shared by ``linear`` and ``performer``: only the feature map φ differs.

With a feature map φ: R^D → R^M the attention weights are w_ij ∝ φ(q_i)ᵀφ(k_j), so

    out_i = Σ_j c_ij φ(q_i)ᵀφ(k_j) v_j  /  Σ_j c_ij φ(q_i)ᵀφ(k_j)          (Katharopoulos et al. 2020, Eq. 4)

and associativity gives O(T) cost: φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ)  (Eq. 5–6). c_ij is
  1                         no bias, bidirectional;
  [j ≤ i]                   causal: prefix sums (Eq. 8–9), here chunked so memory stays O(T);
  exp(b_{i−j})·[j ≤ i]      a relative (Toeplitz) logit bias b: both sums are Toeplitz products,
                            computed by FFT in O(T log T) (Luo et al. 2021, "Stable, Fast and Accurate:
                            Kernelized Attention with Relative Positional Encoding", §3, Eq. 7–8).
Padded keys get φ(k_j) = 0, so they leave numerator *and* denominator.

RoPE (``rope_mode``):
  pre_feature  rotate q, k, then apply φ (what performer-pytorch does);
  numerator    RoFormer Eq. 19: the numerator uses (R_i φ(q_i))ᵀ(R_j φ(k_j)), rotations of width M
               (``Rotation.at_width(M)``); the denominator keeps φ(q_i)ᵀφ(k_j), which cannot vanish.
A content bias (Transformer-XL) is refused: it needs q_iᵀ r_{i−j}, a logit that never exists here.

Notation: B batch, H heads, T length, D head dim, M feature width, E value width (D, or D + 1 with
the denominator's column of ones), N chunks of C positions, L FFT length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attention.base import AttentionContext, AttentionVariant
from harness.errors import ConfigError
from positional.base import Shape

RopeMode = Literal["pre_feature", "numerator"]
CHUNK = 64  # causal prefix-sum chunk: intra-chunk C×C products, inter-chunk (M, E) states
NO_WEIGHT = 1e-10  # relative denominator below which a query counts as seeing no key (see kernelized_attention)
FEATURE_BLOCK = 1  # features per FFT batch in the Toeplitz path; 1 was fastest here (cache), 16 was 2x slower


def toeplitz_matmul(coeffs: Tensor, x: Tensor) -> Tensor:
    """y_i = Σ_j coeffs[h, i − j + Tk − 1] · x_j: a per-head Toeplitz matrix times x, by FFT.

    A Toeplitz matrix embeds in a circulant one, which the FFT diagonalises (Luo et al. 2021, §3.2), so
    the product costs O((Tq + Tk) log(Tq + Tk)) per column instead of O(Tq·Tk).
    coeffs: (H, Tq + Tk − 1), column o ↔ offset i − j = o − (Tk − 1); x: (B, H, Tk, E) -> (B, H, Tq, E).
    """
    y = _circulant_apply(_coeff_spectrum(coeffs), x.transpose(-1, -2), coeffs.shape[-1])  # (B, H, E, Tq)
    return y.transpose(-1, -2)


def _fft_size(n_off: int) -> int:
    # circular convolution of length L ≥ Tq + Tk − 1 leaves outputs Tk − 1 … Tq + Tk − 2 free of wrap-around
    return 1 << (n_off - 1).bit_length()


def _coeff_spectrum(coeffs: Tensor) -> Tensor:
    # FFTs in float64: round-off is relative to the largest entry, and in fp32 a small row would get ~1e-7 of it
    return torch.fft.rfft(coeffs.to(torch.float64), n=_fft_size(coeffs.shape[-1]))[:, None]  # (H, 1, L/2 + 1)


def _circulant_apply(spectrum: Tensor, x: Tensor, n_off: int) -> Tensor:
    """x: (B, H, N, Tk), time last (contiguous FFTs are ~1.6x faster here) -> (B, H, N, Tq)."""
    t_k, size = x.shape[-1], _fft_size(n_off)
    xf = torch.fft.rfft(x.to(torch.float64), n=size)  # (B, H, N, L/2 + 1)
    full = torch.fft.irfft(spectrum * xf, n=size)  # (B, H, N, L): Σ_j a[n − j] x_j
    return full[..., t_k - 1: n_off].to(x.dtype)  # n = i + Tk − 1 for i = 0 … Tq − 1


def relative_coefficients(table: Tensor, t_k: int, causal: bool) -> Tensor:
    """c_o = exp(b_o − max b) per head, 0 for future offsets (i − j < 0) when causal.

    Subtracting the per-head max (over the offsets that can occur) keeps exp finite; the constant
    cancels between numerator and denominator (Luo et al. 2021, §3.3). table: (H, n) -> (H, n).
    """
    offsets = torch.arange(table.shape[-1], device=table.device) - (t_k - 1)  # i − j
    if causal:
        table = table.masked_fill(offsets < 0, float("-inf"))
    return torch.exp(table - table.amax(-1, keepdim=True).detach())


def causal_linear_contract(q: Tensor, k: Tensor, v: Tensor, chunk: int = CHUNK) -> Tensor:
    """Σ_{j ≤ i} (q_iᵀ k_j) v_j by chunked prefix sums (Katharopoulos et al. 2020, Eq. 8–9).

    Earlier chunks enter through an exclusive prefix sum of per-chunk states Σ k_j v_jᵀ; the current
    chunk through a masked C×C product. Memory O(T·C + T/C·M·E), never T×T.
    q, k: (B, H, T, M); v: (B, H, T, E) -> (B, H, T, E).
    """
    B, H, T, _ = q.shape
    tail = -T % chunk
    q, k, v = (F.pad(t, (0, 0, 0, tail)) for t in (q, k, v))  # zero rows add nothing
    n = (T + tail) // chunk
    qc, kc, vc = (t.view(B, H, n, chunk, t.shape[-1]) for t in (q, k, v))  # (B, H, N, C, ·)
    states = kc.transpose(-1, -2) @ vc  # (B, H, N, M, E): one chunk's Σ k_j v_jᵀ
    before = torch.cat([torch.zeros_like(states[:, :, :1]), states.cumsum(2)[:, :, :-1]], 2)  # exclusive
    within = (qc @ kc.transpose(-1, -2)).tril()  # (B, H, N, C, C): j ≤ i inside the chunk
    out = qc @ before + within @ vc  # (B, H, N, C, E)
    return out.view(B, H, n * chunk, -1)[:, :, :T]


def toeplitz_contract(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, block: int = FEATURE_BLOCK) -> Tensor:
    """Σ_j c_{i−j} (q_iᵀ k_j) v_j = q_iᵀ Σ_j c_{i−j} k_j v_jᵀ (Luo et al. 2021, Eq. 8).

    The (M, E) outer products k_j v_jᵀ are Toeplitz-multiplied a block of features at a time, and each
    block is recomputed in backward rather than kept (activation checkpointing): memory O(T·block·E)
    instead of O(T·M·E) — at T = 8192, M = 110 this was 5 GB kept for backward.
    q, k: (B, H, T, M); v: (B, H, T, E); coeffs: (H, 2T − 1). Returns (B, H, T, E).
    """
    spectrum = _coeff_spectrum(coeffs)  # once for all feature blocks
    k_t, v_t = k.transpose(-1, -2), v.transpose(-1, -2)  # (B, H, M, T), (B, H, E, T): time last
    out = torch.zeros_like(v)
    for m in range(0, q.shape[-1], block):
        part = (q[..., m:m + block], k_t[:, :, m:m + block], v_t, spectrum)
        out = out + (checkpoint(_toeplitz_block, *part, use_reentrant=False) if torch.is_grad_enabled()
                     else _toeplitz_block(*part))
    return out


def _toeplitz_block(q: Tensor, k_t: Tensor, v_t: Tensor, spectrum: Tensor) -> Tensor:
    """q: (B, H, T, b); k_t: (B, H, b, T); v_t: (B, H, E, T) -> Σ over the b features, (B, H, T, E)."""
    B, H, E, T = v_t.shape
    kv = (k_t[:, :, :, None] * v_t[:, :, None]).flatten(2, 3)  # (B, H, b·E, T)
    s = _circulant_apply(spectrum, kv, 2 * T - 1).view(B, H, -1, E, T)  # (B, H, b, E, T)
    return torch.einsum("bhtm,bhmet->bhte", q, s)


def linear_contract(q: Tensor, k: Tensor, v: Tensor, causal: bool, coeffs: Tensor | None) -> Tensor:
    """Σ_j c_ij (q_iᵀ k_j) v_j for the three kinds of c (see module docstring). -> (B, H, T, E)."""
    if coeffs is not None:  # causality is already in the coefficients
        return toeplitz_contract(q, k, v, coeffs)
    if causal:
        return causal_linear_contract(q, k, v)
    return q @ (k.transpose(-1, -2) @ v)  # (B, H, T, M) @ (B, H, M, E)


@dataclass(frozen=True)
class Features:
    q: Tensor  # (B, H, T, M) φ(q), as the denominator uses it
    k: Tensor  # (B, H, T, M) φ(k), zero at padded keys
    q_num: Tensor  # φ(q) as the numerator uses it (R_i φ(q_i) in numerator mode)
    k_num: Tensor


def kernelized_attention(f: Features, v: Tensor, causal: bool, coeffs: Tensor | None = None) -> Tensor:
    """out_i = Σ_j c_ij q_num_iᵀ k_num_j v_j / Σ_j c_ij q_iᵀ k_j. v: (B, H, T, D) -> (B, H, T, D).

    A query with no weight (den = 0: every key it may see is padded) gets 0, as softmax gives for an
    all-masked row. On the FFT path round-off replaces that 0 by ~1e-16 of the largest entry, so there a
    query counts as unseeing below ``NO_WEIGHT`` × its unweighted total φ(q_i)ᵀ Σ_j φ(k_j) (an upper bound,
    as c ≤ 1); the exact paths keep every positive denominator, however small.
    """
    ones = v.new_ones(*v.shape[:-1], 1)  # (B, H, T, 1): the denominator is the same sum over v = 1
    if f.q_num is f.q and f.k_num is f.k:  # one pass for both
        both = linear_contract(f.q, f.k, torch.cat([v, ones], -1), causal, coeffs)  # (B, H, T, D + 1)
        num, den = both[..., :-1], both[..., -1:]
    else:
        num = linear_contract(f.q_num, f.k_num, v, causal, coeffs)
        den = linear_contract(f.q, f.k, ones, causal, coeffs)
    floor = 0.0
    if coeffs is not None:
        floor = NO_WEIGHT * (f.q @ f.k.sum(-2, keepdim=True).transpose(-1, -2)).detach()  # (B, H, T, 1)
    seen = den > floor
    return torch.where(seen, num, 0.0) / torch.where(seen, den, 1.0)


class KernelizedAttention(AttentionVariant):
    """Base for variants defined by a feature map φ; subclasses implement ``feature_map``."""

    accepts_bias = frozenset({"relative"})
    bias_refusals = {"content": "kernelized attention never forms the logit q_iᵀk_j a content bias adds to"}

    def __init__(self, shape: Shape, rope_mode: RopeMode = "pre_feature"):
        super().__init__(shape)
        if rope_mode not in ("pre_feature", "numerator"):
            raise ConfigError(f"attn.rope_mode={rope_mode!r} is unknown; use pre_feature or numerator")
        self.rope_mode = rope_mode

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        """(B, H, T, D) -> (B, H, T, M), non-negative."""
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        self.require_accepted(ctx.bias)
        if ctx.rotary is not None and self.rope_mode == "pre_feature":
            q, k = ctx.rotary.rotate(q), ctx.rotary.rotate(k)
        padded = None if ctx.key_padding_mask is None else ~ctx.key_padding_mask[:, None, :, None]  # (B,1,T,1)
        if padded is not None:  # before φ too: a feature map may pool statistics over keys (FAVOR+ does)
            k = k.masked_fill(padded, 0.0)
        phi_q, phi_k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)  # (B, H, T, M)
        if padded is not None:
            phi_k = phi_k.masked_fill(padded, 0.0)
        f = Features(phi_q, phi_k, phi_q, phi_k)
        if ctx.rotary is not None and self.rope_mode == "numerator":
            rotation = self._rotation_at(ctx.rotary, phi_q.shape[-1])
            f = replace(f, q_num=rotation.rotate(phi_q), k_num=rotation.rotate(phi_k))
        coeffs = None
        if ctx.bias is not None:  # relative (accepts_bias): a per-offset table
            coeffs = relative_coefficients(ctx.bias.table.to(v.dtype), ctx.bias.t_k, ctx.causal)
        return kernelized_attention(f, v, ctx.causal, coeffs)  # (B, H, T, D)

    def _rotation_at(self, rotary, width: int):
        at_width = getattr(rotary, "at_width", None)
        if at_width is None:
            raise ConfigError(f"attn.rope_mode=numerator needs a rotation that can act on {width}-wide "
                              "features (at_width); use attn.rope_mode=pre_feature with this pos")
        return at_width(width)
