"""PoPE (Gopalakrishnan et al. 2025): the score against its explicit formula, the logits each attention forms with
it, the relative property, x-transformers parity, and the refusals of attention that cannot take widened q, k."""

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention.base import AttentionContext
from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from positional.base import Shape
from positional.pope import PoPE, pope_inv_freq
from tests.attn_cases import F64, qkv

H, D = 3, 8


def scheme(phase_bias=True, seed=0, **kw) -> PoPE:
    """PoPE in float64 with δ drawn in [−2π, 0] (a trained δ, not the zero start)."""
    pope = PoPE(Shape(H * D, H, 2, 64, causal=False), phase_bias=phase_bias, **kw).double()
    if phase_bias:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            pope.delta.copy_(-2 * math.pi * torch.rand(H * D, generator=g, dtype=F64))
    return pope


def explicit_scores(q, k, q_pos, k_pos, delta, base=10000.0):
    """a_ts = Σ_c softplus(q_tc) softplus(k_sc) cos((s − t)θ_c + δ_hc), θ_c = base^(−c/D), term by term."""
    B, nh, tq, d = q.shape
    theta = torch.tensor([base ** (-c / d) for c in range(d)], dtype=F64)  # (D,)
    out = torch.zeros(B, nh, tq, k.shape[-2], dtype=F64)
    for a, t in enumerate(q_pos.tolist()):
        for b, s in enumerate(k_pos.tolist()):  # one (t, s) pair at a time, the sum over c written out
            out[:, :, a, b] = (
                F.softplus(q[:, :, a]) * F.softplus(k[:, :, b]) * torch.cos((s - t) * theta + delta)
            ).sum(-1)  # (B, H)
    return out


def scores(pope, q, k, positions):
    """q̃ᵀk̃ / √2: the query features carry √2 so that the variants' 1/√(2D) gives 1/√D."""
    rot = pope.rotary(torch.as_tensor(positions))
    return rot.rotate_q(q) @ rot.rotate_k(k).transpose(-1, -2) / math.sqrt(2)


def test_frequencies_are_one_per_component():
    got = pope_inv_freq(D, 10000.0)
    assert got.dtype == F64 and got.tolist() == pytest.approx([10000.0 ** (-c / D) for c in range(D)], rel=1e-15)


@pytest.mark.parametrize("positions", [list(range(9)), [0, 3, 4, 20, 57, 58, 300, 1000, 1001]])
def test_score_is_the_papers_formula(positions):
    q, k, _ = qkv(B=2, H=H, T=len(positions), D=D, seed=1, scale=2.0)
    pope = scheme()
    pos = torch.tensor(positions)
    want = explicit_scores(q, k, pos, pos, pope.phase_shift())
    assert_close(scores(pope, q, k, pos), want, rtol=0, atol=1e-12)


def test_features_are_twice_as_wide_and_the_query_carries_root_two():
    q, k, _ = qkv(B=1, H=H, T=5, D=D, seed=2)
    rot = scheme(phase_bias=False).rotary(torch.arange(5))
    fq, fk = rot.rotate_q(q), rot.rotate_k(k)
    assert fq.shape == fk.shape == (1, H, 5, 2 * D)
    assert_close(fq, math.sqrt(2) * rot.rotate_k(q), rtol=0, atol=1e-14)  # δ = 0: the maps differ by √2 only
    mu = F.softplus(k)  # |k̃_c| = softplus(k_c): the content is the magnitude, the position the phase
    assert_close(fk[..., :D].hypot(fk[..., D:]), mu, rtol=0, atol=1e-14)
    with pytest.raises(TypeError, match="rotate_q / rotate_k"):
        rot.rotate(q)


def test_score_depends_only_on_the_offset():
    """The same q and k at every position: each diagonal s − t = const is constant, δ included."""
    pope = scheme(seed=3)
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(H, D, generator=g, dtype=F64), torch.randn(H, D, generator=g, dtype=F64)
    positions = torch.arange(0, 400, 13)
    T = len(positions)
    s = scores(pope, q[None, :, None].expand(1, H, T, D), k[None, :, None].expand(1, H, T, D), positions)[0]
    for shift in (-7, -1, 0, 2, 10):
        diag = torch.diagonal(s, offset=shift, dim1=-2, dim2=-1)  # (H, T − |shift|)
        assert (diag - diag[:, :1]).abs().max() < 1e-10
    assert not torch.allclose(s[:, 0, 1], s[:, 0, 2])  # …and does depend on it


def test_phase_bias_is_clamped_to_minus_two_pi_zero_and_false_means_zero():
    pope = scheme()
    with torch.no_grad():
        pope.delta.copy_(torch.linspace(-10, 3, H * D, dtype=F64))
    delta = pope.phase_shift()
    assert delta.shape == (H, D) and delta.min() == -2 * math.pi and delta.max() == 0
    plain = scheme(phase_bias=False)
    assert plain.delta is None and not list(plain.parameters())
    assert torch.equal(plain.phase_shift(), torch.zeros(H, D, dtype=F64))
    assert scheme().delta.dim() == 1  # flat: the optimizer's 1-D rule keeps the bias out of weight decay
    assert PoPE(Shape(H * D, H, 2, 64, False)).delta.abs().max() == 0  # starts at 0, as x-transformers


def test_parity_with_x_transformers_polar_embedding():
    xt = pytest.importorskip("x_transformers.x_transformers")
    T = 40
    q, k, _ = qkv(B=2, H=H, T=T, D=D, seed=5, scale=2.0)
    pope = scheme(seed=6)
    polar = xt.PolarEmbedding(D, H)
    with torch.no_grad():
        polar.learned_bias.copy_(pope.delta.view(H, 1, D))
    freqs, bias = polar(torch.arange(T))
    xq, xk = xt.apply_polar_pos_emb(q, freqs), xt.apply_polar_pos_emb(k, freqs + bias)  # float32 inside
    theirs = xq.double() @ xk.double().transpose(-1, -2)
    ours = scores(pope, q, k, torch.arange(T))
    diff = (ours - theirs).abs().max().item()
    assert diff < 5e-5 * theirs.abs().max().item(), diff  # x-transformers rounds θ and the features to float32
    assert_close(ours, explicit_scores(q, k, torch.arange(T), torch.arange(T), pope.phase_shift()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_and_local_weights_are_softmax_of_score_over_root_d(causal):
    T = 12
    q, k, v = qkv(B=2, H=H, T=T, D=D, seed=7)
    pope = scheme(seed=8)
    a = explicit_scores(q, k, torch.arange(T), torch.arange(T), pope.phase_shift()) / math.sqrt(D)
    if causal:
        a = a.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(a, -1)
    shape = Shape(H * D, H, 1, 2 * T, causal)
    ctx = AttentionContext(rotary=pope.rotary(torch.arange(T)), causal=causal)
    # the band of window 2T covers every key
    for variant in (Softmax(shape, backend="math"), Softmax(shape), Local(shape, window=2 * T)):
        assert_close(variant.implied_weights(q, k, ctx), want, rtol=0, atol=1e-12)
        assert_close(variant(q, k, v, ctx), want @ v, rtol=0, atol=1e-12)  # v keeps the head dim


def test_attention_that_cannot_take_widened_queries_refuses_it():
    for variant in (Linear, Performer):
        reason = variant.refusal(PoPE)
        assert reason and "\n" not in reason
        assert f"attn={variant.config_name()} cannot apply queries and keys widened by pos=pope: " in reason
    assert Softmax.refusal(PoPE) is None and Local.refusal(PoPE) is None
    q, k, v = qkv(B=1, H=H, T=6, D=D)
    ctx = AttentionContext(rotary=scheme().rotary(torch.arange(6)))
    with pytest.raises(ConfigError, match="attn=linear got queries and keys widened"):
        Linear(Shape(H * D, H, 1, 6, False))(q, k, v, ctx)  # at forward time too: never run on the wrong width
    cfg = ModelConfig(n_layers=1, d_model=H * D, n_heads=H, d_ff=16)
    with pytest.raises(ConfigError, match="incompatible pairing: attn=performer cannot apply queries and keys"):
        Transformer(cfg, 11, 8, False, pos=PoPE, attn=Performer)


@pytest.mark.parametrize("kw", [{"base": 0.0}, {"base": float("inf")}, {"phase_bias": "yes"}])
def test_bad_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        PoPE(Shape(H * D, H, 1, 8, False), **kw)
    assert "\n" not in str(e.value) and str(e.value).startswith(next(iter(kw)))


@pytest.mark.parametrize("attn", [Softmax, partial(Local, window=4)])
@pytest.mark.parametrize("causal", [False, True])
def test_trains_end_to_end_and_learns_the_phase_bias(attn, causal):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=H * D, n_heads=H, d_ff=32, dropout=0.0)
    model = Transformer(cfg, 17, 16, causal, pos=PoPE, attn=attn)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 17, (4, 16))
    targets = ids.flip(-1)  # position-hungry: reverse the string
    losses = []
    for _ in range(6):
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        assert model.pos.delta.grad is not None and model.pos.delta.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert model.pos.delta.abs().max() > 0
