"""CoPE (Golovneva et al. 2024): counted positions, interpolation and the logit term against explicit loops
in float64, x-transformers' CoPE parity (causal), padding, the bidirectional form and the refusals."""

import math

import pytest
import torch
from torch.testing import assert_close

from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from harness.errors import ConfigError
from positional.base import Shape
from positional.cope import CoPE, cope_interpolate, cope_positions
from positional.randomized import randomized
from tests.attn_cases import F64, qkv

B, H, T, D = 2, 3, 11, 8


def scheme(causal: bool, npos=4, seed=0) -> CoPE:
    torch.manual_seed(seed)
    return CoPE(Shape(H * D, H, 2, 32, causal), npos=npos, init_std=0.5).double()


def explicit(q, k, table, npos, causal):
    """z_ij one entry at a time: gates, the count between j and i, the cap, the interpolation."""
    out = torch.zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=F64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                g = [1 / (1 + math.exp(-float(q[b, h, i] @ k[b, h, t]) / math.sqrt(D))) for t in range(k.shape[2])]
                for j in range(k.shape[2]):
                    if causal and j > i:
                        continue
                    p = min(sum(g[min(i, j) : max(i, j) + 1]), npos - 1)
                    e = table[npos:] if j > i else table[:npos]  # keys after the query: the second table
                    lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
                    out[b, h, i, j] = w * float(q[b, h, i] @ e[hi]) + (1 - w) * float(q[b, h, i] @ e[lo])
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_counted_positions_are_sums_of_gates_between_key_and_query(causal):
    g = torch.rand(2, 7, 7, dtype=F64)
    got = cope_positions(g, causal)
    for i in range(7):
        for j in range(7):
            if causal and j > i:
                continue
            assert_close(got[:, i, j], g[:, i, min(i, j) : max(i, j) + 1].sum(-1), rtol=1e-14, atol=1e-14)


def test_interpolation_between_integer_positions():
    q_e = torch.tensor([[[0.0, 10.0, 20.0, 35.0]]], dtype=F64)  # q·e[n] for n = 0 … 3
    pos = torch.tensor([[[0.0, 0.25, 1.5, 3.0, 2.9]]], dtype=F64)
    assert_close(
        cope_interpolate(q_e.expand(1, 1, 4), pos),
        torch.tensor([[[0.0, 2.5, 15.0, 35.0, 33.5]]], dtype=F64),
        rtol=0,
        atol=1e-13,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_logit_term_equals_explicit_form(causal):
    s = scheme(causal)
    q, k, _ = qkv(B=B, H=H, T=T, D=D, seed=1)
    got = s.logit_bias(torch.arange(T), 1).dense(q, k)
    want = explicit(q, k, s.emb[1], s.npos, causal)
    keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    assert_close(got[..., keep], want[..., keep], rtol=1e-12, atol=1e-12)
    assert s.emb.shape == (2, s.npos * (1 if causal else 2), D)  # per layer; e' only when bidirectional


@pytest.mark.parametrize("t,npos", [(11, 6), (64, 16)])  # 3 % and 30 % of the counts reach the cap
def test_matches_x_transformers_cope(t, npos):
    from x_transformers.x_transformers import CoPE as TheirCoPE

    s = scheme(causal=True, npos=npos)
    theirs = TheirCoPE(dim=D, heads=H, max_pos=npos).double()
    with torch.no_grad():
        theirs.pos_emb.copy_(s.emb[0])
    q, k, _ = qkv(B=B, H=H, T=t, D=D, seed=2, scale=2.0)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    want = theirs(q, logits.masked_fill(future, -torch.finfo(F64).max))  # as its Attend masks before CoPE
    got = s.logit_bias(torch.arange(t), 0).dense(q, k)
    assert_close(got[..., ~future], want[..., ~future], rtol=0, atol=1e-12)  # sums in another order


def test_gradient_reaches_queries_and_keys_through_the_gates():
    s = scheme(causal=True)
    q, k, _ = qkv(B=1, H=H, T=T, D=D, seed=3)
    k.requires_grad_(True)
    s.logit_bias(torch.arange(T), 0).dense(q, k).tril().sum().backward()
    assert k.grad.abs().sum() > 0 and s.emb.grad[0].abs().sum() > 0  # k enters through the gates only


@pytest.mark.parametrize("causal,pad", [(True, "left"), (False, "left"), (False, "right")])
def test_padded_keys_do_not_change_the_term_between_real_tokens(causal, pad):
    s = scheme(causal)
    q, k, _ = qkv(B=1, H=H, T=T, D=D, seed=4)
    real = torch.arange(3, T) if pad == "left" else torch.arange(T - 3)
    k2 = k.clone()
    k2[..., [t for t in range(T) if t not in real.tolist()], :] = 9.0  # whatever sits at the pads
    a, b = (s.logit_bias(torch.arange(T), 0).dense(q, kk)[..., real[:, None], real[None, :]] for kk in (k, k2))
    assert_close(a, b, rtol=0, atol=1e-13)  # pads cancel out of the running sums: round-off only


def test_cope_is_content_only_softmax_applies_it_and_positions_cannot_be_randomized():
    assert CoPE.bias_kind == "content"  # its gates σ(q·k) count positions: the bias reads q and k
    for variant in (Local, Linear, Performer):
        reason = variant.refusal(CoPE)
        assert reason and "content logit bias (pos=cope)" in reason and "\n" not in reason
    with pytest.raises(ConfigError, match="reads no position index"):
        randomized(CoPE, randomize=True, max_position=64)(Shape(16, 2, 1, 8, True))
    with pytest.raises(ConfigError, match=r"^npos=1"):  # worded by argument: a library call, not a config
        CoPE(Shape(16, 2, 1, 8, True), npos=1)
