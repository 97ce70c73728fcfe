"""KERPLE (Chi et al. 2022): both kernels against the formula, the Toeplitz property, the projection,
and the kernelized Toeplitz paths. No installable outside implementation exists (the authors' code is a
GPT-NeoX fork), so the references here are the paper's formulas written out."""

import math

import pytest
import torch
from torch.testing import assert_close

from attention import kernelized
from attention.base import AttentionContext
from attention.linear import Linear
from harness.errors import ConfigError
from positional.base import RelativeBias, Shape
from positional.kerple import EPS, Kerple
from tests.attn_cases import F64, qkv, reference_kernelized

H = 3


def scheme(variant: str, causal: bool, per_layer=False, seed=0) -> Kerple:
    torch.manual_seed(seed)
    return Kerple(Shape(8 * H, H, 2, 64, causal), variant=variant, per_layer=per_layer).double()


def published(variant: str, r1: float, r2: float, i: int, j: int) -> float:
    """The paper's kernels, one (query, key) at a time."""
    d = abs(i - j)
    return -r1 * math.log(1 + r2 * d) if variant == "log" else -r1 * d**r2


@pytest.mark.parametrize("variant", ["log", "power"])
@pytest.mark.parametrize("causal", [False, True])
def test_bias_is_the_published_kernel(variant, causal):
    s = scheme(variant, causal)
    T = 17
    dense = s.logit_biases(torch.arange(T), 2)[0].dense()[0]  # (H, T, T)
    for h in range(H):
        r1, r2 = float(s.r1[0, h]), float(s.r2[0, h])
        want = torch.tensor([[published(variant, r1, r2, i, j) for j in range(T)] for i in range(T)], dtype=F64)
        keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
        assert_close(dense[h][keep], want[keep], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_bias_is_relative_and_depends_on_the_offset_only(variant):
    s = scheme(variant, causal=False)
    bias = s.logit_biases(torch.arange(30), 2)[0]
    assert isinstance(bias, RelativeBias) and bias.kind == "relative"
    dense = bias.dense()[0]  # (H, 30, 30)
    short = s.logit_biases(torch.arange(12), 2)[0].dense()[0]
    for shift in (0, 7, 18):  # any window of the longer input sees the same bias as the short input
        assert_close(dense[:, shift : shift + 12, shift : shift + 12], short, rtol=0, atol=0)
    assert (dense <= 0).all() and (dense.diagonal(dim1=-2, dim2=-1) == 0).all()  # a penalty, 0 at distance 0


def test_initialisation_follows_the_authors_ranges():
    for variant, r1_max, r2_max in (("log", 2.0, 1.0), ("power", 1.0, 2.0)):
        s = Kerple(Shape(8 * 64, 64, 2, 64, False), variant=variant)
        assert 0 <= s.r1.min() and s.r1.max() <= r1_max and s.r1.max() > r1_max / 2
        assert 0 <= s.r2.min() and s.r2.max() <= r2_max and s.r2.max() > r2_max / 2


@pytest.mark.parametrize("variant", ["log", "power"])
@pytest.mark.parametrize("per_layer", [False, True])
def test_parameters_are_projected_into_range_once_per_forward_and_still_train(variant, per_layer):
    s = scheme(variant, causal=True, per_layer=per_layer)
    with torch.no_grad():
        s.r1[:, 0], s.r2[:, 0], s.r2[:, 1] = -3.0, -0.5, 7.0
    biases = s.logit_biases(torch.arange(9), 2)
    assert float(s.r1.min()) == EPS and float(s.r2.min()) == EPS
    assert float(s.r2.max()) == (2.0 if variant == "power" else 7.0)  # the power kernel's exponent ≤ 2
    sum(b.dense().sum() for b in biases).backward()  # projecting after use would break autograd
    assert torch.isfinite(s.r1.grad).all() and torch.isfinite(s.r2.grad).all() and s.r1.grad.abs().sum() > 0


def test_per_layer_gives_each_layer_its_own_parameters():
    s = scheme("log", causal=False, per_layer=True)
    a, b = (x.dense() for x in s.logit_biases(torch.arange(6), 2))
    assert s.r1.shape == (2, H) and not torch.equal(a, b)
    shared = scheme("log", causal=False)
    first, second = shared.logit_biases(torch.arange(6), 2)
    assert first is second  # one object: its dense bias is built once per forward


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["fft", "dense"])
def test_kernelized_toeplitz_paths_apply_kerple_exactly(causal, path, monkeypatch):
    monkeypatch.setattr(kernelized, "DENSE_MAX_ELEMS", 0 if path == "fft" else 1 << 40)
    T, D = 29, 8
    bias = scheme("power", causal).logit_biases(torch.arange(T), 2)[0]
    attn = Linear(Shape(D * H, H, 1, 64, causal)).double()
    q, k, v = qkv(H=H, T=T, D=D, scale=0.5)
    out = attn(q, k, v, AttentionContext(bias=bias, causal=causal))
    phi_q, phi_k = attn.feature_map(q, True), attn.feature_map(k, False)
    ref = reference_kernelized(phi_q, phi_k, v, causal=causal, bias=RelativeBias(bias.table.detach(), T, T))
    assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_unknown_variant_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="^variant='cubic': use log or power") as e:
        Kerple(Shape(16, 2, 1, 8, False), variant="cubic")
    assert "\n" not in str(e.value)
