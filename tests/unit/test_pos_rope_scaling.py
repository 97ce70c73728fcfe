"""RoPE length scaling: each method equals its published formula, and is plain RoPE at s = 1."""

import math

import pytest
import torch

from harness.errors import ConfigError
from positional.base import Shape
from positional.rope import Rope, rope_inv_freq
from positional.rope_scaling import dynamic_ntk_factor, ntk_inv_freq, yarn_attention_scale, yarn_inv_freq
from tests.helpers import rope_args

F64 = torch.float64
D, L, BASE = 32, 64, 10000.0  # head dim, training length, base


def scheme(**kw) -> Rope:
    return Rope(Shape(2 * D, 2, 2, L, causal=False), **rope_args(**kw)).double().eval()


def cos_sin(rope: Rope, positions: torch.Tensor):
    rot = rope.rotary(positions)
    return rot.cos, rot.sin


def expected(positions, theta, scale=1.0):
    angles = positions.to(F64)[:, None] * theta[None, :]
    return angles.cos() * scale, angles.sin() * scale


def test_ntk_is_a_base_change():
    for s in (2.0, 8.0):
        torch.testing.assert_close(
            ntk_inv_freq(rope_inv_freq(D, BASE, F64), s),
            rope_inv_freq(D, BASE * s ** (D / (D - 2)), F64),
            rtol=1e-14,
            atol=0,
        )


def test_linear_is_position_interpolation():
    positions = torch.arange(4 * L)
    got = cos_sin(scheme(scaling="linear", factor=4.0), positions)
    want = expected(positions.to(F64) / 4.0, rope_inv_freq(D, BASE, F64))  # m -> m/s (Chen et al. 2023)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_ntk_uses_the_changed_base():
    positions = torch.arange(2 * L)
    got = cos_sin(scheme(scaling="ntk", factor=2.0), positions)
    want = expected(positions, rope_inv_freq(D, BASE * 2.0 ** (D / (D - 2)), F64))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_dynamic_ntk_takes_s_from_the_length():
    assert dynamic_ntk_factor(L // 2, L) == 1.0 and dynamic_ntk_factor(3 * L, L) == 3.0
    rope = scheme(scaling="dynamic_ntk")
    short = torch.arange(L)
    for g, w in zip(cos_sin(rope, short), expected(short, rope_inv_freq(D, BASE, F64)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)  # within the training length: plain RoPE
    long = torch.arange(3 * L)
    want = expected(long, rope_inv_freq(D, BASE * 3.0 ** (D / (D - 2)), F64))
    for g, w in zip(cos_sin(rope, long), want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def yarn_reference(theta: list[float], s: float, alpha: float, beta: float) -> list[float]:
    """YaRN §3.2 written out per dim: λ = 2π/θ, r = L/λ, piecewise γ, h(θ) = (1−γ)θ/s + γθ."""
    out = []
    for t in theta:
        r = L / (2 * math.pi / t)
        gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        out.append((1 - gamma) * t / s + gamma * t)
    return out


def test_yarn_ramp_and_temperature():
    s, alpha, beta = 4.0, 1.0, 8.0  # β = 8 so that this short L puts dims in all three regimes
    theta = rope_inv_freq(D, BASE, F64)
    want_theta = torch.tensor(yarn_reference(theta.tolist(), s, alpha, beta), dtype=F64)
    r = L * theta / (2 * math.pi)
    assert (r < alpha).any() and (r > beta).any() and ((r > alpha) & (r < beta)).any()
    torch.testing.assert_close(yarn_inv_freq(theta, s, L, alpha, beta), want_theta, rtol=1e-14, atol=0)
    assert yarn_attention_scale(s) == pytest.approx(0.1 * math.log(4.0) + 1)
    positions = torch.arange(s * L)
    got = cos_sin(scheme(scaling="yarn", factor=s, alpha=alpha, beta=beta), positions)
    for g, w in zip(got, expected(positions, want_theta, 0.1 * math.log(s) + 1), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_yarn_temperature_scales_pass_through_dims_too():
    rope = scheme(scaling="yarn", factor=4.0, fraction=0.5)
    x = torch.randn(3, 5, D, dtype=F64)
    out = rope.rotary(torch.arange(5)).rotate(x)
    torch.testing.assert_close(out[..., D // 2 :], x[..., D // 2 :] * (0.1 * math.log(4.0) + 1))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1) * (0.1 * math.log(4.0) + 1))


@pytest.mark.parametrize("scaling", ["linear", "ntk", "dynamic_ntk", "yarn"])
def test_factor_one_is_plain_rope(scaling):
    positions = torch.arange(L)
    plain = cos_sin(scheme(), positions)
    for g, w in zip(cos_sin(scheme(scaling=scaling, factor=1.0), positions), plain, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-14)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_training_always_uses_plain_angles(scaling):
    positions = torch.arange(2 * L)
    plain = cos_sin(scheme().train(), positions)
    for g, w in zip(cos_sin(scheme(scaling=scaling, factor=2.0).train(), positions), plain, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kw",
    [
        dict(scaling="longrope"),
        dict(scaling="linear", factor=0.5),
        dict(factor=2.0),
        dict(scaling="dynamic_ntk", factor=2.0),
        dict(scaling="ntk", factor=2.0, beta=16.0),
        dict(scaling="yarn", factor=2.0, alpha=4.0, beta=2.0),
    ],
)
def test_bad_scaling_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        scheme(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "head_dim, length, kept, interpolated, ramped",
    [
        (32, 64, 0, 11, 5),  # conf/experiment/rope_scaling/scale/toy.yaml: a 32-dim head trained at 64 tokens
        (128, 4096, 21, 18, 25),  # LLaMA 2: 128-dim heads trained at 4096
    ],
)
def test_yarn_ramp_at_toy_and_llama_scale(head_dim, length, kept, interpolated, ramped):
    """The counts the rope_scaling toy report quotes: pairs whose angle YaRN keeps (≥ β = 32 turns in the
    training window), interpolates exactly as PI (< α = 1 turn) and ramps between (s = 4)."""
    theta = rope_inv_freq(head_dim, BASE, F64)
    ratio = yarn_inv_freq(theta, 4.0, length, 1.0, 32.0) / theta
    turns = length * theta / (2 * math.pi)
    assert int((ratio == 1).sum()) == int((turns >= 32).sum()) == kept
    assert int((ratio == 0.25).sum()) == int((turns <= 1).sum()) == interpolated
    assert int(((ratio > 0.25) & (ratio < 1)).sum()) == ramped


def test_eval_scalings_keep_the_configured_dynamic_factor():
    """eval.scalings=[dynamic_ntk] scores the model under the configured dynamic scaling: HF's variant reads
    its k from ``factor`` (s = k·T/L − (k − 1)), which the rescaled model keeps (not k = 1)."""
    rope = scheme(scaling="dynamic_ntk", yarn_variant="hf", factor=4.0)
    long = torch.arange(3 * L)
    configured = cos_sin(rope, long)
    with rope.rescaled("dynamic_ntk", 3 * L) as scaling:
        assert scaling.factor == 4.0 and scaling.yarn_variant == "hf"
        for g, w in zip(cos_sin(rope, long), configured, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    s = 4.0 * 3 - 3.0  # HF: k·T/L − (k − 1)
    want = expected(long, rope_inv_freq(D, BASE * s ** (D / (D - 2)), F64))
    for g, w in zip(configured, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
