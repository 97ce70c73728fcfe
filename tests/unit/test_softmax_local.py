"""Softmax backends and local attention against the explicit O(T²) reference, in float64."""

import pytest
import torch
from torch.testing import assert_close

from attention.base import AttentionContext
from attention.local import Local, band_limits, banded_attention
from attention.softmax import Softmax, masked_softmax
from harness.errors import ConfigError
from positional.base import RelativeBias, Shape
from tests.attn_cases import ContentBias, padding, qkv, reference_softmax, relative_bias, rotation

T, D, H = 37, 8, 3
SHAPE = Shape(D * H, H, 1, 64, False)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [None, "relative", "content"])
def test_softmax_backends_match_reference(backend, causal, bias):
    q, k, v = qkv(T=T, D=D, H=H)
    b = {None: None, "relative": relative_bias(H, T), "content": ContentBias()}[bias]
    keep, rot = padding(2, T), rotation(T, D)
    ctx = AttentionContext(rotary=rot, bias=b, causal=causal, key_padding_mask=keep)
    out = Softmax(SHAPE, backend=backend)(q, k, v, ctx)
    assert_close(out, reference_softmax(q, k, v, causal=causal, key_keep=keep, bias=b, rot=rot))


def test_unknown_backend_and_xformers_without_cuda_are_refused_at_construction():
    with pytest.raises(ConfigError, match="^backend='flash' is unknown"):
        Softmax(SHAPE, backend="flash")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use backend=sdpa") as err:
            Softmax(SHAPE, backend="xformers")
        assert "\n" not in str(err.value)


def test_masked_softmax_gives_zero_rows_and_finite_gradients_when_all_masked():
    logits = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]], requires_grad=True)
    w = masked_softmax(logits)
    assert_close(w[1], torch.zeros(2))
    assert_close(w[0], torch.softmax(torch.tensor([0.0, 1.0]), -1))
    (w * torch.randn(2, 2)).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_band_limits_definition():
    assert band_limits(5, causal=True) == (4, 0)  # i − 5 < j ≤ i: 5 keys
    assert band_limits(5, causal=False) == (2, 2)  # |i − j| ≤ 2
    assert band_limits(4, causal=False) == (2, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 4, 7, 16, 80])
@pytest.mark.parametrize("block", [1, 5, 16])
def test_banded_attention_equals_softmax_with_band_mask(causal, window, block):
    q, k, v = qkv(T=T, D=D, H=H)
    table, keep = relative_bias(H, T), padding(2, T)
    left, right = band_limits(window, causal)
    out = banded_attention(q, k, v, left, right, block, table.table, keep)
    ref = reference_softmax(q, k, v, causal=causal, key_keep=keep, bias=table, band=(left, right))
    assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_local_variant_rotates_and_applies_band(causal):
    q, k, v = qkv(T=T, D=D, H=H)
    rot, b = rotation(T, D), relative_bias(H, T)
    ctx = AttentionContext(rotary=rot, bias=b, causal=causal)
    out = Local(Shape(D * H, H, 1, 64, causal), window=9)(q, k, v, ctx)
    ref = reference_softmax(q, k, v, causal=causal, bias=b, rot=rot, band=band_limits(9, causal))
    assert_close(out, ref)


@pytest.mark.parametrize("window", [0, -3, 65])
def test_local_window_is_validated(window):
    with pytest.raises(ConfigError, match=f"^window={window}"):
        Local(SHAPE, window=window)


def test_local_rejects_a_content_bias_at_forward_time_too():
    q, k, v = qkv(T=T, D=D, H=H)
    with pytest.raises(ConfigError, match="content logit bias"):
        Local(SHAPE, window=4)(q, k, v, AttentionContext(bias=ContentBias()))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_with_a_learned_bias_has_the_reference_gradients(causal, padded):
    """The fused kernel plus the hand-written mask gradient equals autograd through the O(T²) reference,
    for q, k, v and the bias table (causal with left padding leaves all-masked rows: their gradient is 0)."""
    q, k, v = (t.requires_grad_() for t in qkv(T=T, D=D, H=H))
    table = relative_bias(H, T).table.requires_grad_()
    keep = padding(2, T) if padded else None
    w = torch.randn(2, H, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    bias = RelativeBias(table, T, T)
    out = Softmax(SHAPE)(q, k, v, AttentionContext(bias=bias, causal=causal, key_padding_mask=keep))
    grads = torch.autograd.grad((out * w).sum(), (q, k, v, table))
    ref = reference_softmax(q, k, v, causal=causal, key_keep=keep, bias=RelativeBias(table, T, T))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v, table))
    assert_close(out, ref)
    for a, b in zip(grads, ref_grads, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mask_shape", [(1, H, T, T), (2, H, T, T), (1, 1, T, T), (2, 1, 1, T)])
def test_learned_mask_gradients_in_head_slices_and_broadcast_masks(monkeypatch, mask_shape):
    """The hand-written backward's slicing (one head per slice here) and its sum onto a mask broadcast over
    batch, heads or query rows give autograd's gradients through the math backend, for q, k, v and the mask."""
    from attention import softmax

    monkeypatch.setattr(softmax, "SLICE_LOGITS", T * T)  # one head per slice
    mask = torch.randn(mask_shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    w = torch.randn(2, H, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    grads = []
    for backend in (softmax.sdpa_attention, softmax.math_attention):
        inputs = [t.requires_grad_() for t in qkv(T=T, D=D, H=H)] + [mask.clone().requires_grad_()]
        grads.append(torch.autograd.grad((backend(*inputs, False, 0.0) * w).sum(), inputs))
    assert grads[0][-1].shape == mask.shape
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-10)


def _fake_xformers(monkeypatch, call):
    """Pretend CUDA and an installed xformers 0.0.35 whose kernel does ``call``; the probe runs on CPU."""
    import sys
    import types

    from attention import softmax

    xformers, ops = types.ModuleType("xformers"), types.ModuleType("xformers.ops")
    xformers.__version__, xformers.ops, ops.memory_efficient_attention = "0.0.35", ops, call
    monkeypatch.setitem(sys.modules, "xformers", xformers)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(softmax, "PROBE_DEVICE", "cpu")
    softmax.xformers_problem.cache_clear()


@pytest.fixture
def clean_probe():
    from attention import softmax

    softmax.xformers_problem.cache_clear()
    yield
    softmax.xformers_problem.cache_clear()


def test_xformers_that_imports_but_cannot_run_is_refused_in_one_line_with_versions(monkeypatch, clean_probe):
    """The GPU machine's failure: a wheel built for another torch/CUDA imports, then fails when called."""

    def broken(q, k, v, **kw):
        raise NotImplementedError("xFormers wasn't build with CUDA support\n  memory_efficient_attention ...")

    _fake_xformers(monkeypatch, broken)
    with pytest.raises(ConfigError) as err:
        Softmax(SHAPE, backend="xformers")
    message = str(err.value)
    assert "\n" not in message
    for needle in (
        "xFormers wasn't build with CUDA support",
        "xformers 0.0.35",
        f"torch {torch.__version__}",
        "CUDA ",
        "python -m xformers.info",
        "use backend=sdpa",
    ):
        assert needle in message, (needle, message)
    assert Softmax(SHAPE, backend="auto").candidates == ["sdpa"]  # auto leaves a broken xformers out


def test_auto_offers_a_working_xformers_and_picks_the_fastest(monkeypatch, clean_probe):
    _fake_xformers(monkeypatch, lambda q, k, v, **kw: q)
    assert Softmax(SHAPE, backend="xformers").backend_used == "xformers"
    auto = Softmax(SHAPE, backend="auto")
    assert auto.candidates == ["sdpa", "xformers"] and auto.backend_used is None  # decided on the first input

    import time

    from attention.softmax import pick_fastest

    def slow(*a):
        time.sleep(0.02)

    def broken(*a):
        raise RuntimeError("no kernel")

    candidates = {"slow": slow, "broken": broken, "fast": lambda *a: None}
    assert pick_fastest(candidates, lambda backend: backend(None)) == "fast"
    with pytest.raises(ConfigError, match="none of broken ran here"):
        pick_fastest({"broken": broken}, lambda backend: backend(None))


def test_auto_on_cpu_is_sdpa_and_says_so(clean_probe):
    q, k, v = qkv(T=T, D=D, H=H)
    auto = Softmax(SHAPE, backend="auto")
    assert auto.backend_used == "sdpa"
    assert_close(auto(q, k, v, AttentionContext()), Softmax(SHAPE)(q, k, v, AttentionContext()))
