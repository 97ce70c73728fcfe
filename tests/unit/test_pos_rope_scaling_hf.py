"""RoPE length scaling in Hugging Face's forms: llama3, longrope, yarn_variant=hf.

Each against its definition written out in float64, the pass-through convention of each variant,
one-line refusals, and a scaling swapped onto a built scheme. Parity with transformers' own
functions: tests/unit/test_hf_rope_parity.py.
"""

import dataclasses
import math

import pytest
import torch

from harness.config.load import load
from harness.errors import ConfigError
from positional.base import Shape
from positional.rope import Rope, rope_inv_freq
from positional.rope_scaling import (
    OPTIONS_READ,
    RopeScaling,
    dynamic_ntk_factor,
    longrope_attention_scale,
    yarn_hf_inv_freq,
    yarn_inv_freq,
    yarn_ramp_bounds,
)
from positional.rope_trainable import RopeTrainable
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


def llama3_reference(theta: list[float], s: float, low: float, high: float) -> list[float]:
    """Meta's llama-models ``apply_scaling`` written out per frequency: three wavelength bands."""
    out = []
    for t in theta:
        wavelen = 2 * math.pi / t
        if wavelen < L / high:
            out.append(t)
        elif wavelen > L / low:
            out.append(t / s)
        else:
            smooth = (L / wavelen - low) / (high - low)
            out.append((1 - smooth) * t / s + smooth * t)
    return out


def test_llama3_is_metas_three_bands():
    s, low, high = 8.0, 1.0, 4.0
    theta = rope_inv_freq(D, BASE, F64)
    wavelen = 2 * math.pi / theta
    assert (
        (wavelen < L / high).any() and (wavelen > L / low).any() and ((wavelen > L / high) & (wavelen < L / low)).any()
    )
    want = torch.tensor(llama3_reference(theta.tolist(), s, low, high), dtype=F64)
    torch.testing.assert_close(yarn_inv_freq(theta, s, L, low, high), want, rtol=1e-14, atol=0)
    positions = torch.arange(4 * L)
    for g, w in zip(cos_sin(scheme(scaling="llama3", factor=s), positions), expected(positions, want), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)  # and no attention scale


def test_yarn_hf_ramp_is_the_papers_ramp_over_log_turns():
    """Untruncated, with both ends inside [0, R − 1], the authors' index ramp is γ = ln(r/α)/ln(β/α)."""
    theta, s, big_l, alpha, beta = rope_inv_freq(128, BASE, F64), 8.0, 4096, 1.0, 32.0
    low, high = yarn_ramp_bounds(128, BASE, big_l, alpha, beta, truncate=False)
    assert 0 < low < high < 127
    r = big_l * theta / (2 * math.pi)
    gamma = ((r / alpha).log() / math.log(beta / alpha)).clamp(0, 1)
    want = (1 - gamma) * theta / s + gamma * theta
    got = yarn_hf_inv_freq(theta, s, big_l, alpha, beta, BASE, truncate=False)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    paper = yarn_inv_freq(theta, s, big_l, alpha, beta)
    bands = (r <= alpha) | (r >= beta)
    assert torch.equal(got[bands], paper[bands]) and not torch.allclose(got[~bands], paper[~bands])
    truncated = yarn_hf_inv_freq(theta, s, big_l, alpha, beta, BASE, truncate=True)
    assert yarn_ramp_bounds(128, BASE, big_l, alpha, beta, True) == (math.floor(low), math.ceil(high))
    assert not torch.allclose(truncated, got)  # HF's default truncation widens the ramp to whole pairs


def test_dynamic_ntk_hf_factor_starts_at_one_and_grows_k_times_faster():
    for k in (1.0, 2.0, 4.0):
        assert dynamic_ntk_factor(L // 2, L, k) == 1.0 and dynamic_ntk_factor(L, L, k) == 1.0
    assert dynamic_ntk_factor(3 * L, L, 4.0) == 9.0  # 4·3 − 3
    rope = scheme(scaling="dynamic_ntk", yarn_variant="hf", factor=4.0)
    for length, s in ((L // 2, 1.0), (3 * L, 9.0)):
        positions = torch.arange(length)
        want = expected(positions, rope_inv_freq(D, BASE * s ** (D / (D - 2)), F64))
        for g, w in zip(cos_sin(rope, positions), want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_longrope_switches_factors_past_the_training_length():
    short, long = [1.0 + 0.01 * i for i in range(D // 2)], [1.0 + 0.5 * i for i in range(D // 2)]
    theta, s = rope_inv_freq(D, BASE, F64), 4.0
    scale = math.sqrt(1 + math.log(s) / math.log(L))  # Phi-3's default, also within L
    rope = scheme(scaling="longrope", factor=s, short_factor=short, long_factor=long)
    for length, lam in ((L, short), (L + 1, long)):
        positions = torch.arange(length)
        want = expected(positions, theta / torch.tensor(lam, dtype=F64), scale)
        for g, w in zip(cos_sin(rope, positions), want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    fixed = scheme(scaling="longrope", factor=s, short_factor=short, long_factor=long, attention_factor=1.25)
    assert fixed.rotary(torch.arange(L)).cos[0, 0].item() == pytest.approx(1.25, rel=1e-15)
    assert longrope_attention_scale(1.0, L) == 1.0


SHORT = [1.0] * (D // 4)  # fraction 0.5: R/2 = D/4 frequencies


@pytest.mark.parametrize(
    "kw, pass_through",
    [
        (dict(scaling="yarn", factor=4.0), 0.1 * math.log(4.0) + 1),  # the paper: all of q·k divided by t
        (dict(scaling="yarn", yarn_variant="hf", factor=4.0), 1.0),  # HF scales cos and sin only
        (dict(scaling="yarn", yarn_variant="hf", factor=4.0, mscale=1.0, mscale_all_dim=0.5), 1.0),
        (dict(scaling="longrope", factor=4.0, short_factor=SHORT, long_factor=SHORT), 1.0),
    ],
)
def test_pass_through_dims_follow_the_variants_convention(kw, pass_through):
    rope = scheme(fraction=0.5, **kw)
    x = torch.randn(3, 5, D, dtype=F64, generator=torch.Generator().manual_seed(0))
    rot = rope.rotary(torch.arange(5))
    out = rot.rotate(x)
    torch.testing.assert_close(out[..., D // 2 :], x[..., D // 2 :] * pass_through, rtol=1e-15, atol=0)
    scale = rot.cos[0, 0].item()  # position 0: cos = attention scale
    assert scale > 1
    torch.testing.assert_close(out[..., : D // 2].norm(dim=-1), x[..., : D // 2].norm(dim=-1) * scale)


def test_a_swapped_scaling_is_all_the_rope_module_reads():
    """One trained scheme, evaluated under several scalings by assigning ``scheme.scaling``: no state hides in Rope."""
    positions = torch.arange(3 * L)
    trained = scheme(scaling="yarn", factor=4.0)
    geometry = trained.scaling  # carries original_max_len, base and rotated; options left at their defaults
    swaps = [
        dict(scaling="llama3", factor=4.0),
        dict(scaling="yarn", yarn_variant="hf", factor=2.0),
        dict(scaling="dynamic_ntk", yarn_variant="hf", factor=2.0),
        dict(scaling="none"),
    ]
    for options in swaps:
        method, rest = options["scaling"], {k: v for k, v in options.items() if k != "scaling"}
        trained.scaling = dataclasses.replace(geometry, method=method, **{"factor": 1.0, **rest})
        for g, w in zip(cos_sin(trained, positions), cos_sin(scheme(**options), positions), strict=True):
            assert torch.equal(g, w)


@pytest.mark.parametrize(
    "kw", [dict(scaling="llama3", factor=4.0), dict(scaling="yarn", yarn_variant="hf", factor=4.0)]
)
def test_hf_forms_scale_a_learned_theta(kw):
    rope = RopeTrainable(Shape(2 * D, 2, 2, L, causal=False), **rope_args(**kw)).double().eval()
    with torch.no_grad():
        rope.inv_freq.mul_(torch.linspace(0.8, 1.2, D // 2, dtype=F64))
    positions = torch.arange(2 * L)
    want = rope.scaling.frequencies(rope.inv_freq.detach(), 2 * L)  # θ' of the learned θ
    assert not torch.allclose(want.inv_freq, rope.scaling.frequencies(rope_inv_freq(D, BASE, F64), 2 * L).inv_freq)
    for g, w in zip(cos_sin(rope, positions), expected(positions, want.inv_freq, want.attention_scale), strict=True):
        torch.testing.assert_close(g.detach(), w, rtol=0, atol=1e-12)


LISTS = dict(short_factor=[1.0] * (D // 2), long_factor=[2.0] * (D // 2))


@pytest.mark.parametrize(
    "kw",
    [
        dict(scaling="llama3", factor=4.0, low_freq_factor=4.0, high_freq_factor=1.0),  # low ≥ high
        dict(scaling="llama3", factor=4.0, low_freq_factor=0.0),
        dict(scaling="longrope", factor=4.0, short_factor=[1.0] * 3, long_factor=[1.0] * 3),  # R/2 = 16 needed
        dict(scaling="longrope", factor=4.0, short_factor=[1.0] * (D // 2)),  # no long_factor
        dict(scaling="longrope", factor=4.0, short_factor=[1.0] * (D // 2), long_factor=[1.0] * (D // 2 - 1) + [0.0]),
        dict(scaling="longrope", factor=4.0, short_factor=["x"] * (D // 2), long_factor=[1.0] * (D // 2)),
        dict(scaling="yarn", factor=2.0, yarn_variant="transformers"),
        dict(scaling="linear", factor=2.0, yarn_variant="hf"),  # the variant belongs to yarn and dynamic_ntk
        dict(scaling="ntk", factor=2.0, low_freq_factor=2.0),  # llama3's option
        dict(scaling="llama3", factor=2.0, **LISTS),  # longrope's options
        dict(scaling="yarn", factor=2.0, truncate=False),  # HF's fields need yarn_variant=hf
        dict(scaling="yarn", factor=2.0, attention_factor=1.2),
        dict(scaling="yarn", yarn_variant="hf", factor=2.0, mscale=1.0),  # mscale without mscale_all_dim
        dict(scaling="yarn", yarn_variant="hf", factor=2.0, mscale=1.0, mscale_all_dim=1.0, attention_factor=1.0),
        dict(scaling="yarn", yarn_variant="hf", factor=2.0, alpha=0.0),  # HF would read beta_slow=0 as 1
        dict(scaling="longrope", factor=2.0, attention_factor=0.0, **LISTS),
        dict(scaling="dynamic_ntk", yarn_variant="hf", factor=0.5),
    ],
)
def test_bad_hf_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        scheme(**kw)
    assert "\n" not in str(e.value) and str(e.value).split("=")[0].split()[-1].startswith("scaling.")


def test_geometry_the_hf_forms_need_is_checked():
    loose = RopeScaling(method="yarn", yarn_variant="hf", factor=2.0, original_max_len=L)  # base unknown yet
    with pytest.raises(ConfigError, match="base=None"):  # the index ramp needs the base: a swap carries the scheme's
        loose.frequencies(rope_inv_freq(D, BASE, F64), L)
    rope = Rope(Shape(2 * D, 2, 2, L, causal=False), base=BASE, scaling=loose)  # an instance, completed by Rope
    assert rope.scaling.base == BASE and rope.scaling.rotated == D and rope.scaling.original_max_len == L
    loose = RopeScaling(method="longrope", short_factor=[1.0] * 4, long_factor=[1.0] * 4)  # width unknown yet
    with pytest.raises(ConfigError):
        loose.frequencies(rope_inv_freq(D, BASE, F64), L)
    rope = scheme(scaling="longrope", factor=2.0, **LISTS)
    with pytest.raises(ConfigError):  # kernelized attention rotating φ(q) of another width
        rope.rotary(torch.arange(L + 1)).at_width(2 * D)


@pytest.mark.parametrize("method", [m for m in OPTIONS_READ if m != "none"])
def test_each_scaling_file_holds_its_methods_options_and_builds_it(method):
    """conf/pos/scaling/<method>.yaml composes under pos.scaling with exactly the fields its method reads, and
    pos/scaling=none (the default) leaves pos.scaling null: the default run shows no scaling key."""

    from tests.helpers import compose

    node = compose(["pos=rope", f"pos/scaling={method}"]).pos.scaling
    assert set(node) == {"_target_", "_partial_", "method", "factor", "original_max_len", *OPTIONS_READ[method]}
    assert node.method == method and compose(["pos=rope"]).pos.scaling is None
    if method != "longrope":  # its lists are required
        scaled = load(["pos=rope", f"pos/scaling={method}"]).pos
        rope = scaled.factory()(Shape(2 * D, 2, 2, L, causal=False))
        assert rope.scaling.method == method and rope.scaling.base == BASE and rope.scaling.rotated == D


def test_lists_compose_from_the_command_line():
    short = ",".join(["1.5"] * (D // 2))
    spec = load(
        [
            "pos=rope_trainable",
            "pos/scaling=longrope",
            "pos.scaling.factor=2",
            f"pos.scaling.short_factor=[{short}]",
            f"pos.scaling.long_factor=[{short}]",
            "pos.scaling.attention_factor=1.1",
        ]
    )
    rope = spec.pos.factory()(Shape(2 * D, 2, 2, spec.data.seq_len, causal=False))
    assert rope.scaling.short_factor == (1.5,) * (D // 2) and rope.scaling.base == spec.pos.option.kwargs["base"]
    assert rope.scaling.rotated == D and rope.scaling.attention_factor == 1.1
    assert rope.scaling.original_max_len == spec.data.seq_len


@pytest.mark.parametrize(("task", "tokens"), [("task=copy", 41), ("task=passkey", 256)])
def test_a_tasks_scaling_scales_from_its_training_length_not_data_seq_len(task, tokens):
    """data.seq_len does not apply to a synthetic task: the L of the scaling formulas is the task's longest training
    sequence, the model's max length (copy: |w| ≤ 20, 41 tokens; passkey: 256)."""
    from harness.config.resources import model_of
    from tests.helpers import validated

    checked = validated(task, "pos=rope", "pos/scaling=dynamic_ntk")
    length = checked.task.sequence_tokens(checked.spec.data.seq_len)
    model = model_of(checked.spec, checked.tokenizer.vocab_size, length, checked.task.causal)
    assert model.pos.scaling.original_max_len == length == tokens != checked.spec.data.seq_len
