"""Kernelized attention (linear, performer): pure pieces and variants vs explicit O(T²) forms, float64."""

import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch.testing import assert_close

from attention import kernelized
from attention.base import AttentionContext
from attention.kernelized import (
    FFT_RTOL,
    Features,
    causal_linear_contract,
    circulant_kernel,
    kernelized_attention,
    numerator_fft_dtype,
    relative_coefficients,
    toeplitz_contract,
)
from attention.linear import Linear, elu_feature_map
from attention.performer import Performer, default_nb_features
from attention.softmax import math_attention
from harness.errors import ConfigError
from positional.base import RelativeBias, Shape
from tests.attn_cases import (
    F64,
    ContentBias,
    padding,
    qkv,
    reference_kernelized,
    relative_bias,
    rotation,
    rotation_matrices,
)

T, D, H = 37, 8, 3


def dense_toeplitz(coeffs, t_q, t_k):
    """(H, Tq, Tk) matrix with entry (i, j) = coeffs[h, i − j + Tk − 1], element by element."""
    M = torch.empty(coeffs.shape[0], t_q, t_k, dtype=coeffs.dtype)
    for i in range(t_q):
        for j in range(t_k):
            M[:, i, j] = coeffs[:, i - j + t_k - 1]
    return M


def test_relative_coefficients_are_stabilised_and_causal():
    table = torch.tensor([[3.0, -1.0, 0.5, 900.0, 2.0]], dtype=F64)  # T = 3: offsets −2 … 2
    causal = relative_coefficients(table, t_k=3, causal=True)
    assert_close(causal[0, :2], torch.zeros(2, dtype=F64))  # j > i never contributes
    assert_close(causal[0, 2:], torch.exp(table[0, 2:] - 900.0))  # max over the offsets that occur
    assert torch.isfinite(relative_coefficients(table, 3, causal=False)).all()


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_causal_linear_contract_equals_masked_quadratic_form(chunk):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.rand(2, H, T, 6, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(2, H, T, 4, generator=g, dtype=F64)
    quadratic = (q @ k.transpose(-1, -2)).tril() @ v  # Σ_{j ≤ i} (q_iᵀ k_j) v_j with a T×T mask
    assert_close(causal_linear_contract(q, k, v, chunk), quadratic, rtol=1e-12, atol=1e-12)


def variant(name: str, causal: bool, rope_mode: str):
    torch.manual_seed(0)
    shape = Shape(D * H, H, 1, 64, causal)
    made = Linear(shape, rope_mode) if name == "linear" else Performer(shape, nb_features=32, rope_mode=rope_mode)
    return made.double().eval()


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope_mode", [None, "pre_feature", "numerator"])
@pytest.mark.parametrize("with_bias", [False, "fft", "dense"])
def test_kernelized_variant_equals_explicit_quadratic_form(name, causal, rope_mode, with_bias, monkeypatch):
    if with_bias:  # the automatic choice made to take this path
        monkeypatch.setattr(kernelized, "DENSE_MAX_ELEMS", 0 if with_bias == "fft" else 1 << 40)
    attn = variant(name, causal, rope_mode or "pre_feature")
    q, k, v = qkv(T=T, D=D, H=H, scale=0.5)
    keep, rot = padding(2, T), rotation(T, D) if rope_mode else None
    b = relative_bias(H, T) if with_bias else None
    out = attn(q, k, v, AttentionContext(rotary=rot, bias=b, causal=causal, key_padding_mask=keep))

    if rope_mode == "pre_feature":
        q, k = rot.rotate(q), rot.rotate(k)
    phi_q, phi_k = attn.feature_map(q, is_query=True), attn.feature_map(k, is_query=False)
    num_rot = None
    if rope_mode == "numerator":
        wide = rot.at_width(phi_q.shape[-1])
        num_rot = rotation_matrices(wide.cos, wide.sin)  # (T, M, M)
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, key_keep=keep, bias=b, num_rot=num_rot)
    assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_linear_feature_map_is_elu_plus_one():
    x = torch.tensor([-2.0, 0.0, 3.0], dtype=F64)
    assert_close(elu_feature_map(x), torch.tensor([math.exp(-2.0), 1.0, 4.0], dtype=F64))


def softmax_error(nb_features: int, seed: int, causal: bool, with_bias: bool) -> float:
    torch.manual_seed(seed)
    attn = Performer(Shape(16 * 2, 2, 1, 64, causal), nb_features=nb_features).double().eval()
    q, k, v = qkv(B=1, H=2, T=48, D=16, seed=seed, scale=0.6)
    b = relative_bias(2, 48, seed=seed) if with_bias else None
    out = attn(q, k, v, AttentionContext(bias=b, causal=causal))
    mask = None if b is None else b.dense().to(F64)
    if causal:
        future = torch.ones(48, 48, dtype=torch.bool).triu(1)
        mask = (torch.zeros(48, 48, dtype=F64) if mask is None else mask).masked_fill(future, float("-inf"))
    exact = math_attention(q, k, v, mask, causal, 0.0)
    return ((out - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize("causal,with_bias", [(False, False), (True, True)])
def test_performer_converges_to_softmax_as_features_grow(causal, with_bias):
    errors = [sum(softmax_error(m, s, causal, with_bias) for s in range(3)) / 3 for m in (8, 64, 512, 2048)]
    assert all(a > b for a, b in itertools.pairwise(errors)), errors
    assert errors[-1] < 0.25 * errors[0], errors


def test_performer_redraws_are_seeded_identically_across_replicas_and_differ_across_layers():
    shape = Shape(32, 2, 2, 64, False)
    torch.manual_seed(7)
    rank0 = [Performer(shape, redraw_interval=2) for _ in range(2)]  # two layers
    torch.manual_seed(7)
    rank1 = [Performer(shape, redraw_interval=2) for _ in range(2)]
    assert not torch.equal(rank0[0].projection, rank0[1].projection)
    q = torch.randn(1, 2, 8, 16)
    ctx = AttentionContext()
    first = rank0[0].projection.clone()
    for layer in (*rank0, *rank1):
        layer.eval()(q, q, q, ctx)  # evaluation never redraws
        layer.train()
        for step in (0, 0, 1, 1, 2, 2):  # two micro-batches a step: one redraw, before step 2
            layer.before_training_step(step)
            layer(q, q, q, ctx)
    assert not torch.equal(rank0[0].projection, first)
    for a, b in zip(rank0, rank1, strict=True):
        assert torch.equal(a.projection, b.projection)
    assert rank0[0].diagnostics() == {"feature_redraws": 1.0}
    resumed = Performer(shape, redraw_interval=2)
    resumed.load_state_dict(rank0[0].state_dict())  # a checkpoint at step 3 holds draw 1
    resumed.train().before_training_step(3)
    assert torch.equal(resumed.projection, rank0[0].projection)
    resumed.before_training_step(4)
    assert not torch.equal(resumed.projection, rank0[0].projection) and resumed.diagnostics()["feature_redraws"] == 2


def test_performer_configuration_is_validated():
    assert default_nb_features(32) == 110 and default_nb_features(16) == 44 and default_nb_features(128) == 622
    shape = Shape(32, 2, 1, 64, False)
    assert Performer(shape).nb_features == 44
    with pytest.raises(ConfigError, match="^nb_features=45 is odd"):
        Performer(shape, nb_features=45, rope_mode="numerator")
    with pytest.raises(ConfigError, match="^redraw_interval=0"):
        Performer(shape, redraw_interval=0)
    with pytest.raises(ConfigError, match="^rope_mode='post'"):
        Linear(shape, rope_mode="post")


@pytest.mark.parametrize("make", [Linear, Performer])
def test_kernelized_variants_refuse_content_bias(make):
    q, k, v = qkv(T=T, D=D, H=H)
    with pytest.raises(ConfigError, match="content logit bias"):
        make(Shape(D * H, H, 1, 64, False)).double()(q, k, v, AttentionContext(bias=ContentBias()))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["fft", "dense"])
def test_toeplitz_path_gradients_match_explicit_form(causal, path):
    """Both bias paths, the FFT one with its hand-written backward (_ToeplitzContract), equal autograd
    of the O(T²) reference form."""
    g = torch.Generator().manual_seed(3)
    phi_q, phi_k = (torch.rand(2, H, 20, 6, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, H, 20, 4, generator=g, dtype=F64, requires_grad=True)
    table = torch.randn(H, 39, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(2, H, 20, 4, generator=g, dtype=F64)  # a random cotangent

    out = kernelized_attention(
        Features(phi_q, phi_k, phi_q, phi_k), v, causal, relative_coefficients(table, 20, causal), toeplitz=path
    )
    grads = torch.autograd.grad((out * w).sum(), (phi_q, phi_k, v, table))
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, bias=RelativeBias(table, 20, 20))
    ref_grads = torch.autograd.grad((ref * w).sum(), (phi_q, phi_k, v, table))
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_exact_causal_path_keeps_a_tiny_but_real_weight():
    """Query 0 sees only key 0, whose kernel value is e^-40 of a future key's: still its whole output."""
    phi_q = torch.ones(1, 1, 2, 1, dtype=F64)
    phi_k = torch.tensor([math.exp(-40.0), 1.0], dtype=F64).view(1, 1, 2, 1)
    v = torch.tensor([3.0, -1.0], dtype=F64).view(1, 1, 2, 1)
    out = kernelized_attention(Features(phi_q, phi_k, phi_q, phi_k), v, causal=True)
    assert_close(out[0, 0, 0], torch.tensor([3.0], dtype=F64))


def test_circulant_kernel_puts_each_offset_at_its_index_mod_L():
    coeffs = torch.arange(1.0, 8.0, dtype=F64)[None]  # Tq = 3, Tk = 5: offsets −4 … 2 ↦ 1 … 7
    a = circulant_kernel(coeffs, t_k=5)  # L = 8
    assert a.tolist() == [[5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 4.0]]  # a[d mod 8] = c(d)


@pytest.mark.parametrize("causal", [False, True])
def test_fp32_toeplitz_attention_is_within_its_stated_bound(causal):
    """fp32 inputs: the output is within eps·max(den)/min(den)·max|v| of the float64 O(T²) reference
    (the bound numerator_fft_dtype relies on), and that bound picks fp32 here."""
    g = torch.Generator().manual_seed(2)
    t = 200
    phi_q, phi_k = (torch.rand(2, H, t, 6, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(2, H, t, 4, generator=g, dtype=F64)
    table = torch.randn(H, 2 * t - 1, generator=g, dtype=F64)
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, bias=RelativeBias(table, t, t))
    ones = torch.ones(2, H, t, 1, dtype=F64)
    den = toeplitz_contract(phi_q, phi_k, ones, relative_coefficients(table, t, causal), dtype=F64)
    assert numerator_fft_dtype(den, torch.float32) == torch.float32
    f = Features(*(x.float() for x in (phi_q, phi_k, phi_q, phi_k)))
    out = kernelized_attention(f, v.float(), causal, relative_coefficients(table.float(), t, causal), toeplitz="fft")
    bound = torch.finfo(torch.float32).eps * (den.max() / den.min()).item() * v.abs().max().item()
    assert (out.double() - ref).abs().max().item() <= bound


def test_bias_path_is_dense_up_to_the_element_budget_then_fft(monkeypatch):
    q, k = torch.zeros(2, H, 8, 3), torch.zeros(2, H, 8, 3)  # B·H·Tq·Tk = 2·H·64
    monkeypatch.setattr(kernelized, "DENSE_MAX_ELEMS", 2 * H * 64)
    assert kernelized.bias_path(q, k, None, "auto") == "dense"
    monkeypatch.setattr(kernelized, "DENSE_MAX_ELEMS", 2 * H * 64 - 1)
    assert kernelized.bias_path(q, k, None, "auto") == "fft"
    assert kernelized.bias_path(q, k, None, "dense") == "dense" and kernelized.bias_path(q, k, None, "fft") == "fft"
    with pytest.raises(ConfigError, match="use auto, fft, dense or band"):
        kernelized.bias_path(q, k, None, "sparse")


@pytest.mark.parametrize("t_q,t_k", [(3, 5), (12, 7)])
def test_toeplitz_dense_places_each_offset(t_q, t_k):
    coeffs = torch.arange(1.0, t_q + t_k, dtype=F64).expand(2, -1)  # entry o ↔ offset i − j = o − (Tk − 1)
    assert torch.equal(kernelized.toeplitz_dense(coeffs, t_q, t_k), dense_toeplitz(coeffs, t_q, t_k))


def test_numerator_precision_falls_back_to_float64_when_weights_span_too_much():
    den = torch.tensor([1.0, 2.0, 0.0])  # the 0 (a query that sees nothing) does not count
    assert numerator_fft_dtype(den, torch.float32) == torch.float32
    assert numerator_fft_dtype(torch.tensor([1.0, 1.0 / FFT_RTOL * 1e8]), torch.float32) == torch.float64
    assert numerator_fft_dtype(den.double(), torch.float64) == torch.float64


def scheme_bias(name: str, causal: bool, t: int, heads: int = H):
    """The real T5 / ALiBi bias at length t, far field declared (T5 with a short max_distance so that
    small tests reach its constant buckets)."""
    from positional.alibi import ALiBi
    from positional.t5 import T5Bias

    torch.manual_seed(5)
    shape = Shape(D * heads, heads, 1, t, causal)
    pos = T5Bias(shape, num_buckets=8, max_distance=6, init_std=0.5) if name == "t5" else ALiBi(shape)
    return pos.double(), pos.logit_bias(torch.arange(t), 0)


@pytest.mark.parametrize("scheme", ["t5", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_declared_far_field_reproduces_the_bias_table(scheme, causal):
    """b_o = b_{±d} − slope·(|o| − d) for every |o| ≥ d: the contract band_contract relies on."""
    _, bias = scheme_bias(scheme, causal, 50)
    table, far = bias.table.detach(), bias.far
    offsets = torch.arange(-49, 50)
    for side, sign in ((0, 1), (1, -1)):
        beyond = offsets * sign >= far.distance
        anchor = table[:, 49 + sign * far.distance][:, None]  # (H, 1)
        expected = anchor - far.slope[side][:, None].to(table.dtype) * (offsets[beyond].abs() - far.distance)
        assert_close(table[:, beyond], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("scheme", ["t5", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope_mode", [None, "numerator"])
@pytest.mark.parametrize("chunk", [3, 6])
def test_band_path_equals_explicit_quadratic_form(name, scheme, causal, rope_mode, chunk, monkeypatch):
    """Near band + far field by decayed prefix sums is exact: T = 37 in chunks of 3 or 6, so the dense band
    reaches K = ⌈d/C⌉ = 2 or 1 chunks each side for T5 (d = 6), 0 for ALiBi (d = 0),
    so most key pairs are in the far field, with padding on both sides."""
    monkeypatch.setattr(kernelized, "BAND_CHUNK", chunk)
    attn = variant(name, causal, rope_mode or "pre_feature")
    q, k, v = qkv(T=T, D=D, H=H, scale=0.5)
    keep, rot = padding(2, T), rotation(T, D) if rope_mode else None
    _, b = scheme_bias(scheme, causal, T)
    assert kernelized.bias_path(q, k, b.far, "auto", causal) == "band"
    out = attn(q, k, v, AttentionContext(rotary=rot, bias=b, causal=causal, key_padding_mask=keep))

    phi_q, phi_k = attn.feature_map(q, is_query=True), attn.feature_map(k, is_query=False)
    num_rot = rotation_matrices(*(lambda w: (w.cos, w.sin))(rot.at_width(phi_q.shape[-1]))) if rope_mode else None
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, key_keep=keep, bias=b, num_rot=num_rot)
    assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [4, 6])
def test_band_path_gradients_reach_the_bias_parameters_exactly(causal, chunk, monkeypatch):
    """Gradients wrt φ(q), φ(k), v and T5's bucket parameters equal autograd of the O(T²) form (the far
    field reads the table at ±d only, which is exact for the parameters because the buckets are shared)."""
    monkeypatch.setattr(kernelized, "BAND_CHUNK", chunk)
    g = torch.Generator().manual_seed(6)
    t = 40
    phi_q, phi_k = (torch.rand(2, H, t, 6, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, H, t, 4, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(2, H, t, 4, generator=g, dtype=F64)
    pos, b = scheme_bias("t5", causal, t)
    out = kernelized_attention(
        Features(phi_q, phi_k, phi_q, phi_k),
        v,
        causal,
        relative_coefficients(b.table, t, causal),
        toeplitz="band",
        far=b.far,
    )
    grads = torch.autograd.grad((out * w).sum(), (phi_q, phi_k, v, pos.bias))
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, bias=pos.logit_bias(torch.arange(t), 0))
    ref_grads = torch.autograd.grad((ref * w).sum(), (phi_q, phi_k, v, pos.bias))
    for a, r in zip(grads, ref_grads, strict=True):
        assert_close(a, r, rtol=1e-9, atol=1e-9)


def test_band_path_is_taken_only_for_a_declared_decaying_far_field():
    q = torch.zeros(1, H, 1000, 3)
    _, t5 = scheme_bias("t5", False, 1000)
    assert kernelized.bias_path(q, q, t5.far, "auto") == "band"
    assert kernelized.bias_path(q, q, None, "auto") in ("dense", "fft")
    assert kernelized.bias_path(q[:, :, :100], q[:, :, :100], t5.far, "auto") != "band"  # T ≤ 3C: no far keys
    grows = replace(t5.far, slope=-torch.ones(2, H))
    assert kernelized.bias_path(q, q, grows, "auto") != "band"
    with pytest.raises(ConfigError, match="declares its far field"):
        kernelized.bias_path(q, q, None, "band")


@pytest.mark.parametrize("is_query,eps", [(True, 1e-4), (False, 0.0), (False, 1e-4)])
def test_favor_features_equal_performer_pytorch_softmax_kernel_with_gradients(is_query, eps):
    """favor_features is softmax_kernel's φ (same numbers, float64) with a written-out backward."""
    from performer_pytorch.performer_pytorch import softmax_kernel

    from attention.performer import draw_projection, favor_features

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, H, 19, D, generator=g, dtype=F64, requires_grad=True)
    w = draw_projection(12, D, seed=3).to(F64)
    cotangent = torch.rand(2, H, 19, 12, generator=g, dtype=F64)
    ours = favor_features(x, w, is_query, eps)
    ref = softmax_kernel(x, projection_matrix=w, is_query=is_query, eps=eps)
    assert_close(ours, ref, rtol=1e-12, atol=1e-14)
    (d_ours,) = torch.autograd.grad((ours * cotangent).sum(), x)
    (d_ref,) = torch.autograd.grad((ref * cotangent).sum(), x)
    assert_close(d_ours, d_ref, rtol=1e-10, atol=1e-12)


def test_the_projection_is_a_pure_function_of_its_seed_with_orthogonal_gaussian_rows():
    """Performer's projection (left out of tests/unit/test_construction.py's fingerprints: QR's last bits are the
    CPU's) is the same for the same seed, and each block of D rows is orthogonal (Choromanski et al. 2021, §2.4)."""
    from performer_pytorch.performer_pytorch import gaussian_orthogonal_random_matrix

    from attention.performer import draw_projection

    w = draw_projection(2 * D, D, seed=5)
    assert torch.equal(w, draw_projection(2 * D, D, seed=5)) and not torch.equal(w, draw_projection(2 * D, D, seed=6))
    for block in (w[:D].double(), w[D:].double()):
        gram = block @ block.T
        assert_close(gram, torch.diag(torch.diagonal(gram)), rtol=0, atol=1e-4 * float(gram.diagonal().max()))
    torch.manual_seed(5)  # performer-pytorch's rows, each sign flipped or not at random
    assert_close(w.abs(), gaussian_orthogonal_random_matrix(2 * D, D, scaling=0).abs(), rtol=1e-5, atol=1e-6)


def test_favor_features_estimate_the_softmax_kernel_without_bias():
    """Lemma 1's estimate is unbiased only if every row w_m is marginally N(0, I_D), which orthogonal blocks keep
    (Choromanski et al. 2021, §2.4): over many draws φ(q)ᵀφ(k) averages exp(q̂ᵀk̂). φ(0)ᵀφ(0) = exp(−2s) holds
    the keys' stabiliser s, so the ratio is the estimate (1/M) Σ_m exp(w_mᵀq̂ − ‖q̂‖²/2) exp(w_mᵀk̂ − ‖k̂‖²/2)."""
    from attention.performer import draw_projection, favor_features

    d, m, draws = 16, 1024, 32
    q = torch.full((d,), 0.25, dtype=F64)  # along (1, …, 1): every row of a QR block leans off it unless signed
    x = torch.stack([q, q, torch.zeros(d, dtype=F64)]).view(1, 1, 3, d)  # keys q, q, 0: one stabiliser
    estimates = []
    for seed in range(draws):
        phi = favor_features(x, draw_projection(m, d, seed).to(F64), is_query=False, eps=0.0)[0, 0]  # (3, M)
        estimates.append(phi[0] @ phi[1] / (phi[2] @ phi[2]))
    ratio = torch.stack(estimates).mean() / math.exp(float(q @ q) / math.sqrt(d))
    assert abs(float(ratio) - 1) < 0.03, float(ratio)  # 0.03 ≈ 4.5 standard errors of the 32-draw mean
