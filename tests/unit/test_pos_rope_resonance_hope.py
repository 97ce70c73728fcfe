"""pos=rope's resonance (Resonance RoPE, Wang et al. 2024) and hope (HoPE, Chen et al. 2024) options: θ against the
papers' formulas in float64, the relative property, what each is for, and that with both off RoPE is unchanged."""

import math
from functools import partial

import pytest
import torch
from torch.testing import assert_close

from attention.softmax import Softmax
from harness.config.check import check
from harness.config.load import load
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from positional.base import Shape
from positional.p_rope import p_rope_inv_freq
from positional.randomized import randomized
from positional.rope import Rope, apply_rope, rope_angles, rope_inv_freq
from positional.rope_trainable import RopeTrainable
from tests.helpers import compose

F64 = torch.float64
D, L = 32, 100  # head dim; training length


def scheme(head_dim=D, max_len=L, **kw) -> Rope:
    return Rope(Shape(head_dim * 2, 2, 2, max_len, causal=False), **kw).double()


def paper_resonance(width, base=10000.0):
    """Resonance RoPE, Alg. 1: λ_i = 2π/θ_i, λ̃_i = round(λ_i), θ̃_i = 2π/λ̃_i, θ_i = base^(−2i/R)."""
    return [2 * math.pi / round(2 * math.pi / base ** (-2 * i / width)) for i in range(width // 2)]


def paper_hope(width, length, base=10000.0):
    """HoPE: θ_i kept where its period 2π/θ_i fits in the training length, 0 where it does not."""
    theta = [base ** (-2 * i / width) for i in range(width // 2)]
    return [t if 2 * math.pi / t <= length else 0.0 for t in theta]


def test_resonance_rounds_every_wavelength_to_an_integer():
    got = scheme(resonance=True).inv_freq
    assert got.dtype == F64 and got.tolist() == pytest.approx(paper_resonance(D), rel=1e-15, abs=0)
    wavelengths = 2 * math.pi / got
    assert (wavelengths - wavelengths.round()).abs().max() < 1e-9
    assert got.tolist() != pytest.approx(rope_inv_freq(D, 10000.0, F64).tolist(), rel=1e-6)


def test_resonant_angles_beyond_the_training_length_are_angles_seen_in_it():
    """Wang et al. §3: with an integer wavelength λ̃_i ≤ L, position m turns pair i by exactly the angle of
    m mod λ̃_i < L, so no pre-critical pair meets an unseen angle when extrapolating."""
    rope = scheme(resonance=True)
    wavelength = (2 * math.pi / rope.inv_freq).round().long()  # (D/2,)
    beyond = torch.arange(L, 4 * L)
    rot = rope.rotary(beyond)
    for i in torch.nonzero(wavelength <= L).flatten().tolist():
        seen = rope_angles(beyond % wavelength[i], rope.inv_freq)[:, i]  # angles at positions < L
        assert_close(rot.cos[:, i], seen.cos(), rtol=0, atol=1e-10)
        assert_close(rot.sin[:, i], seen.sin(), rtol=0, atol=1e-10)
    plain = scheme().rotary(beyond)  # plain RoPE's angles at these positions are new
    assert not torch.allclose(plain.cos[:, 1], rope_angles(beyond % 8, scheme().inv_freq)[:, 1].cos(), atol=1e-3)


@pytest.mark.parametrize("width,length", [(D, L), (D, 1000), (64, 4096), (16, 7)])
def test_hope_keeps_the_frequencies_that_turn_within_the_training_length(width, length):
    got = scheme(head_dim=width, max_len=length, hope=True).inv_freq
    assert got.tolist() == pytest.approx(paper_hope(width, length), rel=1e-15, abs=0)
    kept = int((got > 0).sum())
    assert 0 < kept < width // 2  # both bands exist at these lengths
    # the kept ones are the k fastest: p-RoPE's θ with p = 2k/D, bit for bit
    assert torch.equal(got, p_rope_inv_freq(width, 2 * kept / width, 10000.0))


def test_hope_reads_max_position_under_randomized_positions():
    rope = randomized(partial(Rope, hope=True), randomize=True, max_position=10 * L)(Shape(2 * D, 2, 1, L, False))
    assert rope.inv_freq.tolist() == pytest.approx(paper_hope(D, 10 * L), rel=1e-15, abs=0)


def test_hope_leaves_the_position_independent_pairs_exactly_unrotated():
    rope = scheme(hope=True)
    x = torch.randn(3, 2, 50, D, dtype=F64)
    y = rope.rotary(torch.arange(50)).rotate(x)
    still = (rope.inv_freq == 0).repeat_interleave(2)  # interleaved pairs (x_2i, x_2i+1)
    assert still.any() and torch.equal(y[..., still], x[..., still])
    assert not torch.allclose(y[..., ~still], x[..., ~still])


def test_both_options_select_then_round():
    got = scheme(hope=True, resonance=True).inv_freq
    want = [r if h > 0 else 0.0 for r, h in zip(paper_resonance(D), paper_hope(D, L), strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-15, abs=0)


@pytest.mark.parametrize("options", [{"resonance": True}, {"hope": True}, {"resonance": True, "hope": True}])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_scores_depend_only_on_the_offset(options, layout):
    g = torch.Generator().manual_seed(0)
    rope = scheme(layout=layout, **options)
    q, k = torch.randn(D, dtype=F64, generator=g), torch.randn(D, dtype=F64, generator=g)
    positions = torch.arange(0, 300, 7)
    rot = rope.rotary(positions)
    scores = rot.rotate(q.expand(len(positions), D)) @ rot.rotate(k.expand(len(positions), D)).T  # (T, T)
    for shift in (-5, -1, 0, 3, 11):
        diag = torch.diagonal(scores, offset=shift)
        assert (diag - diag[0]).abs().max() < 1e-10


def test_at_another_width_the_same_rule_applies():
    """Kernelized attention's rope_mode=numerator rotates M-wide features: the same scheme at width M."""
    rope = scheme(hope=True, resonance=True)
    got = rope.theta_at(12)
    want = [r if h > 0 else 0.0 for r, h in zip(paper_resonance(12), paper_hope(12, L), strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-15, abs=0)


def test_with_both_off_rope_is_bit_identical():
    rope = Rope(Shape(2 * D, 2, 2, L, False))
    assert torch.equal(rope.inv_freq, rope_inv_freq(D, 10000.0, F64))
    assert torch.equal(rope.float().theta_at(12), rope_inv_freq(12, 10000.0, F64))  # θ stays float64 (float64_state)
    x = torch.randn(2, 2, 40, D)
    angles = rope_angles(torch.arange(40), rope_inv_freq(D, 10000.0, F64))
    want = apply_rope(x, angles.cos().float(), angles.sin().float())
    assert torch.equal(
        Rope(Shape(2 * D, 2, 2, L, False), resonance=False, hope=False).rotary(torch.arange(40)).rotate(x), want
    )
    cfg = ModelConfig(n_layers=2, d_model=2 * D, n_heads=2, d_ff=32, dropout=0.0)
    ids = torch.randint(0, 20, (2, 24))
    outs = []
    for pos in (Rope, partial(Rope, resonance=False, hope=False)):
        torch.manual_seed(0)
        outs.append(Transformer(cfg, 20, 24, False, pos=pos, attn=partial(Softmax)).eval()(ids))
    assert torch.equal(*outs)


def test_options_compose_from_the_config():
    spec = load(["task=clm", "pos=rope", "pos.resonance=true", "pos.hope=true"])
    check(spec)  # the model built on meta, as every run's check builds it
    rope = spec.pos.factory()(Shape(2 * D, 2, 1, L, False))
    assert rope.resonance and rope.hope
    assert compose(["pos=rope"]).pos.resonance is False and compose(["pos=rope"]).pos.hope is False


@pytest.mark.parametrize(
    "build,message",
    [
        (partial(Rope, resonance="yes"), "resonance='yes' must be true or false"),
        (partial(Rope, hope=1), "hope=1 must be true or false"),
        (partial(RopeTrainable, hope=True), "hope=true fixes θ (pos=rope's option), but pos=rope_trainable learns θ"),
        (partial(RopeTrainable, resonance=True), "resonance=true fixes θ"),
    ],
)
def test_bad_options_are_refused_in_one_line(build, message):
    with pytest.raises(ConfigError) as e:
        build(Shape(2 * D, 2, 1, L, False))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_hope_with_no_frequency_left_is_refused():
    with pytest.raises(ConfigError, match=r"^hope=true keeps the frequencies .* length 6, and none does"):
        Rope(Shape(2 * D, 2, 1, 6, False), hope=True)
