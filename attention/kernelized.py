"""Kernelized attention shared by ``linear`` and ``performer``: only the feature map φ differs.

With a feature map φ: R^D → R^M the attention weights are w_ij ∝ φ(q_i)ᵀφ(k_j), so

    out_i = Σ_j c_ij φ(q_i)ᵀφ(k_j) v_j  /  Σ_j c_ij φ(q_i)ᵀφ(k_j)          (Katharopoulos et al. 2020, Eq. 4)

and associativity gives O(T) cost: φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ)  (Eq. 5–6). c_ij is
  1                         no bias, bidirectional;
  [j ≤ i]                   causal: prefix sums (Eq. 8–9), here chunked so memory stays O(T);
  exp(b_{i−j})·[j ≤ i]      a relative (Toeplitz) logit bias b: both sums are Toeplitz products,
                            computed by FFT in O(T log T) (Luo et al. 2021, "Stable, Fast and Accurate:
                            Kernelized Attention with Relative Positional Encoding", §3, Eq. 7–8), or,
                            while B·H·T² is small (``DENSE_MAX_ELEMS``), as the exact O(T²) product
                            ((φ(Q)φ(K)ᵀ) ∘ C) V, the faster of the two at those sizes;
                            or, when the bias declares a ``FarField`` (linear in |i − j| beyond a distance
                            d: T5, ALiBi), exactly in O(T·(2K+1)C·(M+E) + N²·M·E) by ``band_contract``: a dense
                            band of the K = ⌈d/C⌉ chunks on each side plus far keys through decayed sums of chunk
                            states Σ k_j v_jᵀ (the exp of a linear bias factorises, r^{i−j} = r^i·r^{−j}).
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
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import AttentionVariant, Positioned
from harness.errors import ConfigError
from harness.ranges import ranged
from positional.base import FarField, Shape, toeplitz_dense

RopeMode = Literal["pre_feature", "numerator"]
CHUNK = 64  # causal prefix-sum chunk: intra-chunk C×C products, inter-chunk (M, E) states
NO_WEIGHT = 1e-10  # relative denominator below which a query counts as seeing no key (see kernelized_attention)
FFT_RTOL = 1e-3  # allowed fp32 round-off bound on a Toeplitz-path output, relative to max|v| (numerator_fft_dtype)
FFT_BLOCK_ELEMS = 1 << 21  # signal samples per FFT call in the Toeplitz path (see _feature_block)
# B·H·Tq·Tk up to which a Toeplitz bias takes the dense path (128 MiB per fp32 T×T tensor): below it the dense
# product, forward and backward, is faster than the FFTs.
DENSE_MAX_ELEMS = 1 << 25
BAND_CHUNK = 64  # band_contract's chunk C; the dense band reaches K = ⌈d/C⌉ chunks to each side
ToeplitzPath = Literal["auto", "fft", "dense", "band"]


def circulant_kernel(coeffs: Tensor, t_k: int) -> Tensor:
    """The first column a of the L×L circulant matrix whose top-left Tq×Tk block is the Toeplitz matrix:
    a[d mod L] = coeffs at offset d = i − j, zero elsewhere, so y_i = Σ_j a[(i − j) mod L] x_j for
    i < Tq and the output is the first Tq entries of the circular convolution (no slicing from the middle).
    coeffs: (H, Tq + Tk − 1) -> (H, L)."""
    n_off = coeffs.shape[-1]
    # circular convolution of length L ≥ Tq + Tk − 1 keeps every offset −(Tk−1) … Tq−1 apart (no wrap-around)
    gap = coeffs.new_zeros(coeffs.shape[0], (1 << (n_off - 1).bit_length()) - n_off)
    return torch.cat([coeffs[:, t_k - 1 :], gap, coeffs[:, : t_k - 1]], -1)  # offsets 0 … Tq−1, pad, −(Tk−1) … −1


def numerator_fft_dtype(den: Tensor, dtype: torch.dtype) -> torch.dtype:
    """fp32 for the numerator's FFTs when its round-off stays within ``FFT_RTOL`` of max|v|, else float64 (always for
    float64 inputs; kernelized_attention keeps its denominator in float64 whatever the inputs).

    fp32 FFT round-off is ~eps of a convolution's largest output, so output i = num_i / den_i is off by
    about eps · max(den) / den_i · max|v|, within the bound eps · max(den) / min(den) · max|v|
    (tests/unit/test_kernelized.py). Bidirectional rows see similar weight (a small ratio: fp32); causal rows
    near the start see few keys (ratio ~T), so long causal sequences keep float64.
    """
    if dtype == torch.float64:
        return dtype
    den = den.detach()
    seen = den[den > 0]
    ratio = float(den.amax() / seen.amin()) if seen.numel() else float("inf")
    return torch.float32 if torch.finfo(torch.float32).eps * ratio <= FFT_RTOL else torch.float64


def _spectrum(kernel: Tensor, dtype: torch.dtype) -> Tensor:
    # the kernel's own FFT in float64 (H transforms, cheap), rounded once to the working precision
    spectrum = torch.fft.rfft(kernel.to(torch.float64))  # (H, L/2 + 1)
    return spectrum.to(torch.complex128 if dtype == torch.float64 else torch.complex64)[:, None]  # (H, 1, L/2+1)


def relative_coefficients(table: Tensor, t_k: int, causal: bool) -> Tensor:
    """c_o = exp(b_o − max b) per head, 0 for future offsets (i − j < 0) when causal.

    Subtracting the per-head max (over the offsets that can occur) keeps exp finite; the constant
    cancels between numerator and denominator (Luo et al. 2021, §3.3). table: (H, n) -> (H, n).
    """
    offsets = torch.arange(table.shape[-1], device=table.device) - (t_k - 1)  # i − j
    if causal:
        table = table.masked_fill(offsets < 0, float("-inf"))
    return torch.exp(table - table.amax(-1, keepdim=True).detach())


def _band_reach(far: FarField) -> int:
    """K = ⌈d/C⌉, C = ``BAND_CHUNK``: band_contract's query chunk takes the K chunks on each side densely, so keys
    K + 1 chunks away or more (|i − j| ≥ K·C + 1 > d) are all in the far field.
    Dense keys per query (2K + 1)·C ≥ 2d + C: a small C wastes less of the band on far offsets (T5 at
    d = 128: 320 keys with C = 64, 384 with C = 128), a large one keeps the N² chunk carry small."""
    return -(-far.distance // BAND_CHUNK)


def bias_path(q: Tensor, k: Tensor, far: FarField | None, path: ToeplitzPath, causal: bool = False) -> str:
    """How a Toeplitz bias is applied: band (a declared far field, some keys beyond the band, slopes that
    do not grow with distance on a side that is used), else dense (``path``, or for auto while
    B·H·Tq·Tk ≤ ``DENSE_MAX_ELEMS``) or fft."""
    if path not in ("auto", "fft", "dense", "band"):
        raise ConfigError(f"toeplitz path {path!r} is unknown; use auto, fft, dense or band")
    if path == "band" and far is None:
        raise ConfigError("toeplitz path 'band' needs a bias that declares its far field; use auto, fft or dense")
    if far is not None and path in ("auto", "band"):
        used = far.slope[:1] if causal else far.slope  # causal ALiBi's future side grows, but is never read
        if path == "band" or (k.shape[-2] > (2 * _band_reach(far) + 1) * BAND_CHUNK and bool((used >= 0).all())):
            return "band"
    small = q.shape[:-1].numel() * k.shape[-2] <= DENSE_MAX_ELEMS
    return "dense" if path == "dense" or (path == "auto" and small) else "fft"


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


def band_contract(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, far: FarField, causal: bool) -> Tensor:
    """Σ_j c_{i−j} (q_iᵀ k_j) v_j, exactly, for coefficients geometric beyond the far field's distance d:
    c_o = c_{±d} · r±^{|o| − d}, r = exp(−slope) (Luo et al. 2021, Eq. 8, with the Toeplitz matrix split).

    Chunks of C = ``BAND_CHUNK`` positions, K = ⌈d/C⌉ (``_band_reach``); query chunk n takes chunks n−K … n+K
    densely with the exact c (offsets up to (K+1)C − 1, any values), and chunks m ≤ n−K−1 (m ≥ n+K+1) through
    ``_far_keys``: there |i − j| ≥ KC + 1 > d, so c factorises into a query weight, a key weight and
    r^{C·(chunk distance)}.
    Memory O(T·((2K+1)C + M·E/C)). q, k: (B, H, T, M); v: (B, H, T, E); coeffs: (H, 2T − 1). -> (B, H, T, E).
    """
    B, H, T, M = q.shape
    C, K = BAND_CHUNK, _band_reach(far)
    n = -(-T // C)
    q, k, v = (F.pad(t, (0, 0, 0, n * C - T)) for t in (q, k, v))  # zero rows: no weight, outputs cut below
    out = _near_band(q, k, v, coeffs, C, K, T)  # (B, H, N, C, E)
    if n >= K + 2 and far.distance <= T - 1:
        qc, kc, vc = (t.view(B, H, n, C, t.shape[-1]) for t in (q, k, v))  # (B, H, N, C, ·)
        out = out + _far_keys(qc, kc, vc, coeffs[:, T - 1 + far.distance], far.slope[0], C, K, far.distance)
        if not causal:  # the future side is the past side of the reversed order: flip the chunk maths
            out = out + _far_keys(
                qc, kc, vc, coeffs[:, T - 1 - far.distance], far.slope[1], C, K, far.distance, future=True
            )
    return out.view(B, H, n * C, -1)[:, :, :T]


def _near_band(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, C: int, K: int, T: int) -> Tensor:
    """Each query chunk against the keys of its own and the K chunks on each side, weighted by the exact c.
    q, k, v padded to N·C rows. Returns (B, H, N, C, E)."""
    W = (2 * K + 1) * C  # keys per window
    a = torch.arange(C, device=q.device)[:, None]
    b = torch.arange(W, device=q.device)[None, :]
    column = (a - b + K * C + T - 1).clamp(0, 2 * T - 2)  # (C, W): offset i − j = a − b + KC (clamped: zero keys)
    return _NearBand.apply(q, F.pad(k, (0, 0, K * C, K * C)), F.pad(v, (0, 0, K * C, K * C)), coeffs[:, column], C)


def _windows(x: Tensor, C: int, W: int) -> Tensor:
    """(L, ·) rows of one (batch, head), padded by KC on both ends -> (N, W, ·): window n is rows nC … nC + W − 1,
    an overlapping view (no copy; each window is a contiguous block of rows, as bmm wants)."""
    n = (x.shape[0] - W) // C + 1
    return x.as_strided((n, W, x.shape[1]), (C * x.stride(0), x.stride(0), x.stride(1)))


def _overlap_add(d_windows: Tensor, C: int) -> Tensor:
    """The adjoint of ``_windows``: (N, W, ·) -> (L, ·), each row the sum over the windows that hold it."""
    n, W, width = d_windows.shape
    out = d_windows.new_zeros(n + W // C - 1, C, width)
    for s in range(W // C):  # window n's block s is rows (n + s)C … (n + s + 1)C − 1
        out[s : s + n] += d_windows[:, s * C : (s + 1) * C]
    return out.view(-1, width)


class _NearBand(torch.autograd.Function):
    """out[n] = ((q_n k_wᵀ) ∘ c) v_w over each query chunk n and its key window w, one batch × head at a time.

    Written out so that the key and value windows stay overlapping views of the padded rows (bmm reads
    them in place) and their gradients are summed back by ``_overlap_add``: autograd through ``unfold``
    copied each window for the products and scattered it back in backward.
    q: (B, H, N·C, M); k, v: (B, H, (N + 2K)·C, ·) padded; c: (H, C, W). Returns (B, H, N, C, E).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, C):
        B, H, TC, M = q.shape
        W, n = c.shape[-1], TC // C
        out = q.new_empty(B, H, n, C, v.shape[-1])
        scores = q.new_empty(B, H, n, C, W)  # q_n k_wᵀ, kept for the gradient of c
        for b in range(B):
            for h in range(H):
                torch.bmm(q[b, h].reshape(n, C, M), _windows(k[b, h], C, W).mT, out=scores[b, h])
                torch.bmm(scores[b, h] * c[h], _windows(v[b, h], C, W), out=out[b, h])
        ctx.save_for_backward(q, k, v, c, scores)
        ctx.C = C
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, c, scores = ctx.saved_tensors
        C = ctx.C
        B, H, n, _, W = scores.shape
        d_q, d_k, d_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        d_c = torch.zeros_like(c)
        for b in range(B):
            for h in range(H):
                k_w, v_w, q_n = _windows(k[b, h], C, W), _windows(v[b, h], C, W), q[b, h].reshape(n, C, -1)
                d_weights = d_out[b, h] @ v_w.mT  # (N, C, W)
                d_c[h] += (d_weights * scores[b, h]).sum(0)
                d_v[b, h] = _overlap_add((scores[b, h] * c[h]).mT @ d_out[b, h], C)
                d_scores = d_weights.mul_(c[h])
                d_q[b, h] = (d_scores @ k_w).view(-1, q.shape[-1])
                d_k[b, h] = _overlap_add(d_scores.mT @ q_n, C)
        return d_q, d_k, d_v, d_c, None


def _far_keys(
    qc: Tensor, kc: Tensor, vc: Tensor, c_d: Tensor, slope: Tensor, C: int, K: int, d: int, future: bool = False
) -> Tensor:
    """Σ over keys K + 1 or more chunks back (ahead, ``future``) of c_d·r^{|i − j| − d} (q_iᵀ k_j) v_j.

    Past: query i = nC + a, key j = mC + b, m ≤ n − K − 1: |i − j| − d = (n − m − K − 1)C + a + (C − b) + (KC − d),
    every term ≥ 0, so r^· ≤ 1 throughout (no overflow): per chunk the state Σ_b r^{C−b} k_j v_jᵀ, carried
    to chunk n with r^{(n−m−K−1)C}, read by r^{a + KC − d} q_i. Future: the same with a ↦ C−1−a, C−b ↦ b+1,
    m ↔ n. qc, kc: (B, H, N, C, M); vc: (B, H, N, C, E); c_d, slope: (H,). Returns (B, H, N, C, E).
    """
    n = qc.shape[2]
    pos = torch.arange(C, device=qc.device, dtype=slope.dtype)
    q_exp, k_exp = (C - 1 - pos, pos + 1) if future else (pos, C - pos)  # (C,) each
    decay = lambda e: torch.exp(-slope.view(-1, *[1] * e.dim()) * e).to(qc.dtype)  # noqa: E731 — (H, *e.shape)
    # the position weights go on the E-wide side (v, the output), not the M-wide features: M > E for FAVOR+
    states = kc.transpose(-1, -2) @ (vc * decay(k_exp)[None, :, None, :, None])  # (B, H, N, M, E)
    chunk = torch.arange(n, device=qc.device)
    lag = (chunk[None, :] - chunk[:, None] if future else chunk[:, None] - chunk[None, :]) - K - 1  # (N, N)
    carry = decay(C * lag.clamp(min=0).to(slope.dtype)) * (lag >= 0)  # (H, N, N), 0 where m is near n
    carried = torch.einsum("hnm,bhmxe->bhnxe", carry, states)  # (B, H, N, M, E): Σ_m r^{C·lag} state_m
    q_weight = c_d.to(qc.dtype)[:, None] * decay(q_exp + (K * C - d))  # (H, C): c_d r^{a + KC − d}
    return (qc @ carried) * q_weight[None, :, None, :, None]  # (B, H, N, C, E)


def toeplitz_contract(q: Tensor, k: Tensor, v: Tensor, coeffs: Tensor, dtype: torch.dtype) -> Tensor:
    """Σ_j c_{i−j} (q_iᵀ k_j) v_j = q_iᵀ Σ_j c_{i−j} k_j v_jᵀ (Luo et al. 2021, Eq. 8).

    Every one of the M·E sequences k_{·m} v_{·e} is Toeplitz-multiplied by FFT. A block of features goes
    through one rfft/irfft call (``_feature_block``), and backward is written out (``_ToeplitzContract``)
    so that nothing of size T·M·E is kept: memory O(T·(M + E)) plus one block's O(T·block·E).
    ``dtype``: the FFTs' precision (kernelized_attention's: float64 for the denominator, ``numerator_fft_dtype``).
    q, k: (B, H, T, M); v: (B, H, T, E); coeffs: (H, 2T − 1). Returns (B, H, T, E) in v's dtype.
    """
    kernel = circulant_kernel(coeffs, k.shape[-2]).to(dtype)  # (H, L)
    return _ToeplitzContract.apply(q.to(dtype), k.to(dtype), v.to(dtype), kernel).to(v.dtype)


def _feature_block(batch: int, heads: int, width: int, size: int) -> int:
    """Features per FFT call: as many as keep one block's (B, H, b, E, L) signals under ``FFT_BLOCK_ELEMS``."""
    return max(1, FFT_BLOCK_ELEMS // (batch * heads * width * size))


class _ToeplitzContract(torch.autograd.Function):
    """out_e = Σ_m q_m ∘ C (k_m ∘ v_e), C the Toeplitz matrix of a circular kernel a (time-last signals).

    Backward, with g = ∂/∂out and y_me = C (k_m ∘ v_e) recomputed per block:
      ∂q_m = Σ_e g_e ∘ y_me;   ∂x_me = Cᵀ (q_m ∘ g_e) = irfft(rfft(q_m ∘ g_e) · conj(Â));
      ∂k_m = Σ_e ∂x_me ∘ v_e;  ∂v_e = Σ_m ∂x_me ∘ k_m;   ∂a = irfft(Σ rfft(q_m ∘ g_e) · conj(rfft(k_m ∘ v_e))),
    four FFT passes per block, as autograd with checkpointing needs, without its zero-filled slice
    gradients and copies (which cost more than the FFTs themselves).
    """

    @staticmethod
    def forward(ctx, q, k, v, kernel):
        ctx.save_for_backward(q, k, v, kernel)
        spectrum = _spectrum(kernel, q.dtype)
        q_t, k_t, v_t = (t.transpose(-1, -2) for t in (q, k, v))  # (B, H, ·, T): time last
        out_t = v_t.new_zeros(v_t.shape)  # (B, H, E, T)
        for m, y, _ in _blocks(k_t, v_t, spectrum, kernel.shape[-1]):  # y: (B, H, b, E, T)
            out_t += torch.einsum("bhmet,bhmt->bhet", y, q_t[:, :, m])  # einsum, not mul+sum: no size-1 sums
        return out_t.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, kernel = ctx.saved_tensors
        spectrum = _spectrum(kernel, q.dtype)
        size, t_k, t_q = kernel.shape[-1], k.shape[-2], q.shape[-2]
        q_t, k_t, v_t, g_t = (t.transpose(-1, -2) for t in (q, k, v, grad))  # (B, H, ·, T)
        conj = spectrum.conj().resolve_conj()[:, None]  # (H, 1, 1, L/2 + 1): Cᵀ in frequency
        B, H, M, E = q.shape[0], q.shape[1], q.shape[-1], v.shape[-1]
        padded = q_t.new_zeros(B, H, min(_feature_block(B, H, E, size), M), E, size)  # (B, H, b, E, L)
        dq_t, dk_t, dv_t = q_t.new_zeros(q_t.shape), k_t.new_zeros(k_t.shape), v_t.new_zeros(v_t.shape)
        d_spec = spectrum.new_zeros(spectrum.shape[0], spectrum.shape[-1]) if ctx.needs_input_grad[3] else None
        for m, y, x_f in _blocks(k_t, v_t, spectrum, size, keep_spectrum=d_spec is not None):
            dq_t[:, :, m] = torch.einsum("bhmet,bhet->bhmt", y, g_t)  # Σ_e g_e ∘ y_me
            gy = padded[:, :, : m.stop - m.start]
            torch.mul(q_t[:, :, m, None, :], g_t[:, :, None], out=gy[..., :t_q])  # (B, H, b, E, Tq) q_m ∘ g_e
            gy_f = torch.fft.rfft(gy)  # (B, H, b, E, L/2 + 1)
            if d_spec is not None:
                d_spec += torch.einsum("bhmef,bhmef->hf", x_f.conj(), gy_f)  # Σ gy_f·conj(x_f): (H, L/2 + 1)
            dx = torch.fft.irfft(gy_f.mul_(conj), n=size)[..., :t_k]  # (B, H, b, E, Tk)
            dk_t[:, :, m] = torch.einsum("bhmet,bhet->bhmt", dx, v_t)
            dv_t += torch.einsum("bhmet,bhmt->bhet", dx, k_t[:, :, m])
        d_kernel = torch.fft.irfft(d_spec, n=size).to(kernel.dtype) if d_spec is not None else None
        return dq_t.transpose(-1, -2), dk_t.transpose(-1, -2), dv_t.transpose(-1, -2), d_kernel


def _blocks(k_t: Tensor, v_t: Tensor, spectrum: Tensor, size: int, keep_spectrum: bool = False):
    """For each feature block m: (m, y = C (k_m ∘ v_e) of shape (B, H, b, E, T), rfft(k_m ∘ v_e) or None)."""
    B, H, M, T = k_t.shape
    E = v_t.shape[2]
    block = _feature_block(B, H, E, size)
    padded = k_t.new_zeros(B, H, min(block, M), E, size)  # written into [..., :T], tail 0: no pad per FFT call
    for m0 in range(0, M, block):
        m = slice(m0, min(M, m0 + block))
        x = padded[:, :, : m.stop - m0]
        torch.mul(k_t[:, :, m, None, :], v_t[:, :, None], out=x[..., :T])  # (B, H, b, E, T) k_m ∘ v_e
        x_f = torch.fft.rfft(x)  # (B, H, b, E, L/2 + 1)
        y = torch.fft.irfft(x_f * spectrum[:, None] if keep_spectrum else x_f.mul_(spectrum[:, None]), n=size)
        yield m, y[..., :T], (x_f if keep_spectrum else None)


@dataclass(frozen=True)
class Features:
    q: Tensor  # (B, H, T, M) φ(q), as the denominator uses it
    k: Tensor  # (B, H, T, M) φ(k), zero at padded keys
    q_num: Tensor  # φ(q) as the numerator uses it (R_i φ(q_i) in numerator mode)
    k_num: Tensor


def kernelized_attention(
    f: Features,
    v: Tensor,
    causal: bool,
    coeffs: Tensor | None = None,
    toeplitz: ToeplitzPath = "auto",
    far: FarField | None = None,
) -> Tensor:
    """out_i = Σ_j c_ij q_num_iᵀ k_num_j v_j / Σ_j c_ij q_iᵀ k_j. v: (B, H, T, D) -> (B, H, T, D).

    A query with no weight (den = 0: every key it may see is padded) gets 0, as softmax gives for an
    all-masked row. On the FFT path round-off replaces that 0 by ~1e-16 of the largest entry, so there a
    query counts as unseeing below ``NO_WEIGHT`` × its unweighted total φ(q_i)ᵀ Σ_j φ(k_j) (an upper bound,
    as c ≤ 1); the exact paths keep every positive denominator, however small.

    On the FFT path the denominator is always convolved in float64 (it is 1/(D+1) of the FFT work): a
    true 0 must stay far below the floor, and fp32 round-off (~1e-7 of the largest term) would not. The
    numerator's precision is chosen from the denominators (``numerator_fft_dtype``).
    ``toeplitz``: how a bias (coeffs) is applied, see ``bias_path``; the dense and band paths are exact.
    ``far``: the bias's declared far field (``band_contract``), if any.
    """
    path = None if coeffs is None else bias_path(f.q, f.k, far, toeplitz, causal)
    floor: float | Tensor = 0.0  # the denominator at or below which a query counts as seeing no key
    if coeffs is None and causal:
        num, den = _num_den(f, v, causal_linear_contract)
    elif coeffs is None:  # Eq. 6: φ(q_i)ᵀ (Σ_j φ(k_j) x_jᵀ), (B, H, T, M) @ (B, H, M, ·); sharing features, the
        # denominator rides along as a column of ones on v (Σ_j φ(k_j) as its own product is a matrix-vector forward
        # and an outer-product backward, both far below the matmul rate)
        num, den = _num_den(f, v, lambda q, k, x: q @ (k.transpose(-1, -2) @ x))
    elif path == "band":
        assert far is not None  # bias_path chooses the band for a declared far field only
        num, den = _num_den(f, v, partial(band_contract, coeffs=coeffs, far=far, causal=causal))
    elif path == "dense":
        c = toeplitz_dense(coeffs, f.q.shape[-2], f.k.shape[-2])  # (H, Tq, Tk)
        num, den = _num_den(f, v, lambda q, k, x: ((q @ k.transpose(-1, -2)) * c) @ x)  # (B, H, Tq, Tk) weights
    else:  # fft
        den = toeplitz_contract(f.q, f.k, v.new_ones(*v.shape[:-1], 1), coeffs, dtype=torch.float64)
        num = toeplitz_contract(f.q_num, f.k_num, v, coeffs, dtype=numerator_fft_dtype(den, v.dtype))
        floor = NO_WEIGHT * (f.q @ f.k.sum(-2, keepdim=True).transpose(-1, -2)).detach()  # (B, H, T, 1)
    # an unseeing row divides by +inf: 0, with zero gradients, in one pass over num (not two wheres and a divide)
    return num / torch.where(den > floor, den, torch.inf)


def _num_den(f: Features, v: Tensor, contract) -> tuple[Tensor, Tensor]:
    """Numerator Σ_j c_ij q_numᵀk_num v_j (B, H, T, D) and denominator Σ_j c_ij qᵀk (B, H, T, 1) by one
    ``contract(q, k, x)``; one pass for both when they share features (the denominator is x = 1)."""
    ones = v.new_ones(*v.shape[:-1], 1)
    if f.q_num is f.q and f.k_num is f.k:
        both = contract(f.q, f.k, torch.cat([v, ones], -1))  # (B, H, T, D + 1)
        return both[..., :-1], both[..., -1:]
    return contract(f.q_num, f.k_num, v), contract(f.q, f.k, ones)


class KernelizedAttention(AttentionVariant):
    """Base for variants defined by a feature map φ; subclasses implement ``feature_map``."""

    document_mask_refusal = (
        "it sums φ(k)vᵀ over keys without forming the T × T matrix, and no attention "
        "across documents would need those sums restarted at each document (not written)"
    )
    accepts_bias = frozenset({"relative"})
    bias_refusals = {
        "content": "kernelized attention never forms the logit q_iᵀk_j a content bias adds to",
        "positional": "a bias that depends on more than i − j (FIRE, or pos.randomize=true) has no "
        "Toeplitz form, which is how kernelized attention applies a bias",
    }
    wide_rotary_refusal = (
        "kernelized attention never forms q̃ᵀk̃: its feature map takes head-dim queries and "
        "keys (FAVOR+'s projection is M × D), and rotating φ's features (rope_mode=numerator) "
        "is not the scheme's map"
    )

    @ranged
    def __init__(self, shape: Shape, rope_mode: RopeMode = "pre_feature"):
        super().__init__(shape)
        self.rope_mode = rope_mode

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        """(B, H, T, D) -> (B, H, T, M), non-negative."""
        raise NotImplementedError

    def rotates_itself(self) -> bool:
        return self.rope_mode == "numerator"  # RoFormer Eq. 19: the rotation acts on φ's features (``features``)

    def attend(self, p: Positioned, v: Tensor) -> Tensor:
        bias = p.relative(self.config_name())
        if torch.compiler.is_compiling():  # model.compile=true: the feature map's gradients of the strided q/k
            # views of the fused projection otherwise reach its backward in a layout AOT autograd traced
            # differently ("view size is not compatible" at run time, attn=linear); inductor fuses the copies
            p = replace(p, q=p.q.contiguous(), k=p.k.contiguous())
        f = self.features(p)  # (B, H, T, M) each
        if bias is None:
            return kernelized_attention(f, v, p.ctx.causal)  # (B, H, T, D)
        # relative (accepts_bias): a per-offset table, maybe with its far field
        coeffs = relative_coefficients(bias.table.to(v.dtype), bias.t_k, p.ctx.causal)  # (H, Tq + Tk − 1)
        return kernelized_attention(f, v, p.ctx.causal, coeffs, far=bias.far)  # (B, H, T, D)

    def weights(self, p: Positioned) -> Tensor:
        """w_ij = c_ij φ_num(q_i)ᵀφ_num(k_j) / Σ_j c_ij φ(q_i)ᵀφ(k_j) (Katharopoulos et al. 2020, Eq. 4), with
        c_ij = exp(b_{i−j}) (Luo et al. 2021, Eq. 7) times the causal mask, and φ_num the numerator's features
        (rotated there in rope_mode=numerator, RoFormer Eq. 19, so rows need not sum to 1 nor stay ≥ 0): ``attend``
        applied to v = I (out = w @ v), so a query that sees no key has a zero row."""
        t_k = p.k.shape[-2]
        identity = torch.eye(t_k, dtype=p.q.dtype, device=p.q.device).expand(*p.q.shape[:2], t_k, t_k)  # (B, H, Tk, Tk)
        return self.attend(p, identity)  # (B, H, Tq, Tk)

    def features(self, p: Positioned) -> Features:
        """φ(q), φ(k) as ``attend`` uses them (q, k rotated before φ in rope_mode=pre_feature), padded keys
        zeroed, and in rope_mode=numerator the numerator's features rotated (RoFormer Eq. 19)."""
        q, k, padding = p.q, p.k, p.ctx.key_padding_mask
        padded = None if padding is None else ~padding[:, None, :, None]  # (B, 1, T, 1)
        if padded is not None:  # before φ too: a feature map may pool statistics over keys (FAVOR+ does)
            k = k.masked_fill(padded, 0.0)
        phi_q, phi_k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)  # (B, H, T, M)
        if padded is not None:
            phi_k = phi_k.masked_fill(padded, 0.0)
        if p.rotary is None:
            return Features(phi_q, phi_k, phi_q, phi_k)
        at_width = getattr(p.rotary, "at_width", None)
        if at_width is None:
            raise ConfigError(
                f"rope_mode=numerator needs a rotation that can act on {phi_q.shape[-1]}-wide "
                "features (at_width); use rope_mode=pre_feature with this positional scheme"
            )
        rotation = at_width(phi_q.shape[-1])
        return Features(phi_q, phi_k, rotation.rotate_q(phi_q), rotation.rotate_k(phi_k))
