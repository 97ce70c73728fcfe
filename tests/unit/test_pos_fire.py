"""FIRE (Li et al. 2023): inputs and bias against the formula, dependence on (i − j, i) only, boundedness at
any length, gradients, and the refusals. No installable outside implementation exists (the paper's code
is a listing in its appendix), so the references are the formula written out."""

import math

import pytest
import torch
from torch.testing import assert_close

from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from positional.base import PositionalBias, Shape
from positional.fire import Fire, fire_inputs
from tests.attn_cases import F64

H = 3


def scheme(causal: bool, seed=0, **kw) -> Fire:
    torch.manual_seed(seed)
    return Fire(Shape(8 * H, H, 2, 64, causal), **kw).double()


def published_input(i: int, j: int, c: float, L: float, causal: bool, last: int, eps=1e-6) -> float:
    """ψ(i − j)/ψ(max(L, i)) (causal, the paper); the signed form with N_i = max(i, last − i) otherwise."""
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    reach = i if causal else max(i, last - i)
    sign = (i > j) - (i < j)
    return sign * psi(abs(i - j)) / (psi(max(L, reach)) + eps)


def mlp_by_hand(s: Fire, x: float) -> torch.Tensor:
    """f_θ(x) = W2·relu(W1·x + b1) + b2, one head per output. -> (H,)"""
    first, last = s.mlps[0][0], s.mlps[0][2]
    hidden = torch.relu(first.weight[:, 0] * x + first.bias)  # (W,)
    return last.weight @ hidden + last.bias


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", [list(range(11)), [0, 2, 3, 9, 40, 41, 90]])
def test_inputs_and_bias_equal_the_formula(causal, positions):
    s = scheme(causal, init_c=0.7, init_L=4.0)  # a small L, so max(L, i) takes both branches
    p = torch.tensor(positions)
    got = s.logit_bias(p, 0).dense()[0]  # (H, T, T)
    c, L = float(s.c[0]), float(s.L_multiplier[0] * s.init_L)
    inputs = fire_inputs(p, s.c[0], s.init_L * s.L_multiplier[0], causal)  # (T, T)
    for a, i in enumerate(positions):
        for b, j in enumerate(positions):
            x = published_input(i, j, c, L, causal, positions[-1])
            assert abs(float(inputs[a, b]) - x) < 1e-14
            assert_close(got[:, a, b], mlp_by_hand(s, x), rtol=1e-13, atol=1e-13)


def test_causal_bias_depends_only_on_offset_and_query_position():
    s = scheme(causal=True, init_L=6.0)
    long = s.logit_bias(torch.arange(40), 0).dense()[0]  # (H, 40, 40)
    short = s.logit_bias(torch.arange(15), 0).dense()[0]
    assert_close(long[:, :15, :15], short, rtol=0, atol=0)  # the length does not enter
    i, j = torch.tril_indices(40, 40)
    by_pair = {}
    for a, b in zip(i.tolist(), j.tolist(), strict=True):
        by_pair.setdefault((a - b, a), []).append(long[:, a, b])
    assert all(len(v) == 1 for v in by_pair.values())  # (i − j, i) names each entry: nothing else to vary
    # rows i ≤ L share the normaliser ψ(L): there the bias is a function of i − j alone
    assert_close(long[:, 5, 2], long[:, 4, 1], rtol=0, atol=0)
    assert not torch.allclose(long[:, 30, 27], long[:, 20, 17])  # beyond L it depends on i too


@pytest.mark.parametrize("causal", [False, True])
def test_inputs_stay_in_unit_interval_and_bias_is_bounded_at_any_length(causal):
    s = scheme(causal, seed=2, init_L=16.0)
    first = s.mlps[0][0]
    # f_θ is piecewise linear in its scalar input: its extremes on [−1, 1] lie at the ends or at a kink
    kinks = (-first.bias / first.weight[:, 0]).clamp(-1, 1).detach()
    points = torch.cat([kinks, torch.tensor([-1.0, 1.0], dtype=F64)])
    bound = max(mlp_by_hand(s, float(x)).abs().max() for x in points)
    for T in (8, 300, 2500):
        seen = torch.ones(T, T, dtype=torch.bool)  # the keys a query may attend (causal: j ≤ i)
        seen = seen.tril() if causal else seen
        with torch.no_grad():
            x = fire_inputs(torch.arange(T), s.c[0].abs(), s.init_L * s.L_multiplier[0], causal)  # (T, T)
            if T < 1000:  # the MLP over T² inputs: kept small, the bound holds for any input in [−1, 1]
                assert s.logit_bias(torch.arange(T), 0).dense()[..., seen].abs().max() <= bound + 1e-12
        assert x[seen].abs().max() <= 1
        if causal:  # the paper's range [0, 1], 0 only at j = i
            assert x[seen].min() >= 0 and x[torch.ones(T, T, dtype=torch.bool).tril(-1)].gt(0).all()


def test_c_and_threshold_learn():
    s = scheme(causal=True)
    s.logit_bias(torch.arange(20), 0).dense().square().sum().backward()
    assert s.c.grad.abs().item() > 0 and s.L_multiplier.grad.abs().item() > 0  # T < L: ψ(L) normalises
    assert all(torch.isfinite(p.grad).all() for p in s.parameters())


def test_layers_share_one_mlp_unless_per_layer():
    shared = scheme(causal=True)
    first, second = shared.logit_biases(torch.arange(6), 2)
    assert first is second and len(shared.mlps) == 1
    own = scheme(causal=True, per_layer=True)
    a, b = own.logit_biases(torch.arange(6), 2)
    assert len(own.mlps) == 2 and own.c.shape == (2,) and not torch.equal(a.dense(), b.dense())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", [list(range(40)), [0, 3, 4, 9, 40, 41, 90]])
def test_below_the_threshold_psi_of_L_normalises_every_row_and_L_learns(causal, positions):
    s = scheme(causal, init_L=100.0)  # every position ≤ L: one normaliser, ψ(L)
    p = torch.tensor(positions)
    got = s.logit_bias(p, 0)
    x = fire_inputs(p, s.c[0].abs(), s.init_L * s.L_multiplier[0], causal)  # (T, T): the general path
    want = s.mlps[0](x.unsqueeze(-1)).permute(2, 0, 1)  # (H, T, T)
    assert_close(got.dense()[0], want, rtol=1e-14, atol=1e-14)
    got.dense().square().sum().backward()
    assert s.L_multiplier.grad.abs().item() > 0 and s.c.grad.abs().item() > 0


def test_fire_is_a_positional_bias_that_only_softmax_applies():
    s = scheme(causal=True, init_L=2.0)
    assert s.bias_kind == "positional" and isinstance(s.logit_bias(torch.arange(4), 0), PositionalBias)
    for variant in (Local, Linear, Performer):
        reason = variant.refusal(Fire)
        assert reason and "\n" not in reason and "more than i − j" in reason
