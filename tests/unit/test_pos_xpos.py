"""xPos (Sun et al. 2022): the scale formula, the logits it gives, its relative property, x-transformers parity."""

import math

import pytest
import torch

from attention.base import AttentionContext
from attention.linear import Linear
from attention.local import Local
from attention.softmax import Softmax
from harness.errors import ConfigError
from positional.base import Shape
from positional.xpos import XPos, xpos_zeta
from tests.attn_cases import F64, qkv, rotation_matrices

D = 16


def test_zeta_is_two_i_plus_gamma_d_over_one_plus_gamma_d():
    got = xpos_zeta(D, 0.4)
    want = [(2 * i + 0.4 * D) / (1.4 * D) for i in range(D // 2)]
    assert got.dtype == F64 and got.tolist() == pytest.approx(want, rel=1e-15, abs=0)
    assert got[0] == pytest.approx(0.4 / 1.4) and got.diff().gt(0).all() and got.lt(1).all()


@pytest.mark.parametrize("causal", [False, True])
def test_a_position_is_mapped_alike_whatever_follows_it(causal):
    """Sun et al. §3's maps read their own position only, f_q(q, n) and f_k(k, m): the first 64 positions of a
    1024-long input turn and scale as in a 64-long one. Kernelized attention applies φ to the scaled q and k, where
    no logit cancels a centre, so one that moved with the input would reach every output: a causal prefix would
    change with what follows it, a padded row with its padding."""
    shape = Shape(2 * D, 2, 1, 64, causal)
    scheme, attn = XPos(shape).double(), Linear(shape).double()
    q, k, v = qkv(B=1, H=2, T=1024, D=D, seed=5)
    short, long = scheme.rotary(torch.arange(64)), scheme.rotary(torch.arange(1024))
    torch.testing.assert_close(long.rotate_q(q)[..., :64, :], short.rotate_q(q[..., :64, :]), rtol=1e-13, atol=0)
    torch.testing.assert_close(long.rotate_k(k)[..., :64, :], short.rotate_k(k[..., :64, :]), rtol=1e-13, atol=0)
    real = torch.arange(1024)[None, :] < 64  # (1, T): a row of 64 tokens padded to 1024
    got = attn(q, k, v, AttentionContext(rotary=long, causal=causal, key_padding_mask=None if causal else real))
    want = attn(q[..., :64, :], k[..., :64, :], v[..., :64, :], AttentionContext(rotary=short, causal=causal))
    torch.testing.assert_close(got[..., :64, :], want, rtol=0, atol=1e-12)


def explicit_logits(q, k, n, m, base=10000.0, gamma=0.4, scale_base=512.0):
    """(ζ^{n/B} ∘ R_n q) · (ζ^{−m/B} ∘ R_m k) pair by pair, uncentred: q (…, Tq, D) at positions n, k at m."""
    theta = [base ** (-2 * i / D) for i in range(D // 2)]
    zeta = [(2 * i + gamma * D) / ((1 + gamma) * D) for i in range(D // 2)]
    out = torch.zeros(*q.shape[:-2], len(n), len(m), dtype=F64)
    for a, pn in enumerate(n):
        for b, pm in enumerate(m):
            for i in range(D // 2):
                ang = (pm - pn) * theta[i]  # R_nᵀ R_m = R_{m−n}: the pair's score depends on m − n
                q0, q1, k0, k1 = q[..., a, 2 * i], q[..., a, 2 * i + 1], k[..., b, 2 * i], k[..., b, 2 * i + 1]
                score = (q0 * k0 + q1 * k1) * math.cos(ang) + (q1 * k0 - q0 * k1) * math.sin(ang)
                out[..., a, b] += zeta[i] ** ((pn - pm) / scale_base) * score
    return out


@pytest.mark.parametrize("positions", [list(range(9)), [0, 3, 4, 10, 200, 201, 700]])
def test_logits_equal_the_explicit_scaled_rotation(positions):
    q, k, _ = qkv(B=1, H=2, T=len(positions), D=D)
    rot = XPos(Shape(2 * D, 2, 1, 16, True), scale_base=64.0).double().rotary(torch.tensor(positions))
    got = rot.rotate_q(q) @ rot.rotate_k(k).transpose(-1, -2)
    want = explicit_logits(q, k, positions, positions, scale_base=64.0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_logits_depend_only_on_the_offset(layout):
    q, k, _ = qkv(B=1, H=1, T=12, D=D, seed=3)
    scheme = XPos(Shape(D, 1, 1, 16, True), layout=layout).double()
    logits = []
    for shift in (0, 5, 1000):  # the centre moves with the positions; the logits must not
        rot = scheme.rotary(torch.arange(12) + shift)
        logits.append(rot.rotate_q(q) @ rot.rotate_k(k).transpose(-1, -2))
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], rtol=1e-11, atol=1e-11)


def test_scale_decays_to_the_past_per_frequency():
    # q = k = e_{2i}: the logit of a query at n and a key at m is ζ_i^((n−m)/B)·cos((n−m)θ_i)
    scheme = XPos(Shape(D, 1, 1, 16, True), base=1e30).double()  # θ_i ≈ 0 for i > 0: the decay alone
    rot = scheme.rotary(torch.arange(600))
    i = D // 2 - 2
    e = torch.zeros(1, 1, 600, D, dtype=F64)
    e[..., 2 * i] = 1.0
    row = (rot.rotate_q(e)[..., -1:, :] @ rot.rotate_k(e).transpose(-1, -2))[0, 0, 0]  # query at 599
    zeta = xpos_zeta(D, 0.4)[i]
    offset = 599 - torch.arange(600, dtype=F64)  # n − m
    want = zeta ** (offset / 512.0) * torch.cos(offset * 1e30 ** (-2 * i / D))
    torch.testing.assert_close(row, want, rtol=1e-12, atol=1e-12)


def x_transformers_xpos(q, k, exact: bool):
    """x-transformers 2.x RotaryEmbedding(use_xpos=True): q·scale, k·scale⁻¹, centred at T // 2."""
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

    theirs = RotaryEmbedding(D, use_xpos=True, scale_base=512).double()
    if exact:  # its θ is built in float32 (``.float()``); the same expression evaluated in float64
        theirs.inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=F64) / D))
        theirs.scale = (torch.arange(0, D, 2, dtype=F64) + 0.4 * D) / (1.4 * D)
    freqs, scale = theirs.forward_from_seq_len(q.shape[-2])  # (1, T, D) each
    return apply_rotary_pos_emb(q, freqs, scale), apply_rotary_pos_emb(k, freqs, scale**-1.0)


@pytest.mark.parametrize("T", [33, 64])  # odd and even: both centre at ⌊T/2⌋
def test_matches_x_transformers_rotary_with_xpos(T):
    q, k, _ = qkv(B=2, H=3, T=T, D=D, seed=7)
    rot = XPos(Shape(3 * D, 3, 1, T, True)).rotary(torch.arange(T))
    want_q, want_k = x_transformers_xpos(q, k, exact=True)
    torch.testing.assert_close(rot.rotate_q(q), want_q, rtol=0, atol=1e-13)
    torch.testing.assert_close(rot.rotate_k(k), want_k, rtol=0, atol=1e-13)
    as_shipped_q, _ = x_transformers_xpos(q, k, exact=False)  # float32 θ: within float32 round-off
    torch.testing.assert_close(rot.rotate_q(q), as_shipped_q, rtol=0, atol=1e-6)


def test_a_single_rotate_is_refused_so_no_variant_can_treat_q_and_k_alike():
    rot = XPos(Shape(D, 1, 1, 8, True)).rotary(torch.arange(4))
    with pytest.raises(TypeError, match="rotate_q or rotate_k"):
        rot.rotate(torch.zeros(1, 1, 4, D))


def test_at_width_is_xpos_at_that_width():
    rot = XPos(Shape(D, 1, 1, 8, True)).double().rotary(torch.arange(6))
    narrow = XPos(Shape(8, 1, 1, 8, True)).double().rotary(torch.arange(6))
    x = torch.randn(2, 6, 8, dtype=F64)
    torch.testing.assert_close(rot.at_width(8).rotate_q(x), narrow.rotate_q(x), rtol=0, atol=0)
    torch.testing.assert_close(rot.at_width(8).rotate_k(x), narrow.rotate_k(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "variant", [Softmax(Shape(2 * D, 2, 1, 40, True), backend="math"), Local(Shape(2 * D, 2, 1, 40, True), window=40)]
)
def test_attention_variants_scale_queries_and_keys_apart(variant):
    from attention.base import AttentionContext

    q, k, v = qkv(B=2, H=2, T=40, D=D, seed=11)
    rot = XPos(Shape(2 * D, 2, 1, 40, True), scale_base=16.0).double().rotary(torch.arange(40))
    got = variant.double()(q, k, v, AttentionContext(rotary=rot, causal=True))
    logits = rot.rotate_q(q) @ rot.rotate_k(k).transpose(-1, -2) / math.sqrt(D)
    future = torch.ones(40, 40, dtype=torch.bool).triu(1)
    want = torch.softmax(logits.masked_fill(future, float("-inf")), -1) @ v
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(layout="zigzag"), dict(gamma=0.0), dict(scale_base=-1.0)])
def test_bad_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        XPos(Shape(D, 1, 1, 8, True), **kw)
    assert "\n" not in str(e.value)


def test_rotation_matrices_view_agrees():
    # the scaled rotation is R_n scaled per pair: check one position against the block-diagonal matrix
    rot = XPos(Shape(D, 1, 1, 8, True)).double().rotary(torch.arange(5))
    R = rotation_matrices(rot.q.cos, rot.q.sin)  # (T, D, D), scale folded into cos, sin
    x = torch.randn(5, D, dtype=F64)
    torch.testing.assert_close(rot.rotate_q(x), torch.einsum("tmn,tn->tm", R, x), rtol=0, atol=1e-13)
