"""RoPE (RoFormer, Su et al. 2021): the rotation's defining properties, layouts, partial rotary."""

import pytest
import torch

from harness.errors import ConfigError
from positional.base import Shape
from positional.rope import Rope, apply_rope, apply_rope_half, rope_angles, rope_inv_freq, rotated_width

F64 = torch.float64


def scheme(head_dim=16, n_heads=2, **kw) -> Rope:
    return Rope(Shape(head_dim * n_heads, n_heads, 2, 64, causal=False), **kw).double()


def rotate_at(rope: Rope, x: torch.Tensor, positions) -> torch.Tensor:
    return rope.rotary(torch.as_tensor(positions)).rotate(x)


def test_inv_freq_is_base_to_the_minus_2i_over_d():
    theta = rope_inv_freq(8, 10000.0, F64)
    torch.testing.assert_close(theta, torch.tensor([1.0, 10.0**-1, 10.0**-2, 10.0**-3], dtype=F64))


def test_interleaved_equals_complex_multiplication():
    """RoFormer Eq. 12 / 34: (x_{2i} + i x_{2i+1}) · e^{i m θ_i}."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=F64, generator=g)  # (B, T, D)
    positions = torch.tensor([0, 1, 7, 30, 1000])
    theta = rope_inv_freq(16, 10000.0, F64)
    expected = torch.view_as_real(
        torch.view_as_complex(x.unflatten(-1, (8, 2)).contiguous())
        * torch.polar(torch.ones(5, 8, dtype=F64), positions.to(F64)[:, None] * theta)
    ).flatten(-2)
    torch.testing.assert_close(rotate_at(scheme(), x, positions), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_score_depends_only_on_relative_position_and_norm_is_kept(layout, fraction):
    g = torch.Generator().manual_seed(1)
    rope = scheme(layout=layout, fraction=fraction)
    q, k = torch.randn(16, dtype=F64, generator=g), torch.randn(16, dtype=F64, generator=g)
    positions = torch.arange(0, 200, 7)
    rq = rotate_at(rope, q.expand(len(positions), 16), positions)  # (T, D): q at every position
    rk = rotate_at(rope, k.expand(len(positions), 16), positions)
    scores = rq @ rk.T  # (T, T): ⟨R_m q, R_n k⟩
    for shift in (-5, -1, 0, 3, 11):  # every diagonal m − n = const is constant
        diag = torch.diagonal(scores, offset=shift)
        assert (diag - diag[0]).abs().max() < 1e-10
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(len(positions)), rtol=0, atol=1e-12)


def test_half_layout_is_interleaved_up_to_a_dim_permutation():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 16, dtype=F64, generator=g)
    cos, sin = (f(rope_angles(torch.arange(6), rope_inv_freq(16, 10000.0, F64))) for f in (torch.cos, torch.sin))
    perm = torch.arange(16).view(2, 8).T.flatten()  # half-layout dim order -> interleaved pairs
    torch.testing.assert_close(
        apply_rope_half(x, cos, sin)[..., perm], apply_rope(x[..., perm], cos, sin), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_partial_rotary_rotates_leading_dims_only(layout):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 16, dtype=F64, generator=g)
    positions = torch.arange(9)
    out = rotate_at(scheme(layout=layout, fraction=0.25), x, positions)
    torch.testing.assert_close(out[..., 4:], x[..., 4:], rtol=0, atol=0)
    full = scheme(head_dim=4, n_heads=8, layout=layout)  # a 4-dim RoPE: θ over the rotated width
    torch.testing.assert_close(out[..., :4], rotate_at(full, x[..., :4], positions), rtol=0, atol=1e-12)


def test_at_width_is_the_same_scheme_at_another_width():
    rope = scheme(layout="half", fraction=0.5)
    rot = rope.rotary(torch.arange(5))
    wide = rot.at_width(64)
    assert wide.cos.shape == (5, 16)  # 2⌊0.5·64/2⌋ = 32 rotated dims
    assert wide.apply is apply_rope_half
    torch.testing.assert_close(wide.cos, torch.cos(rope_angles(torch.arange(5), rope_inv_freq(32, 10000.0, F64))))
    assert rotated_width(10, 0.5) == 4


@pytest.mark.parametrize("kw", [dict(fraction=0.3), dict(fraction=0.0), dict(fraction=1.5), dict(layout="neox")])
def test_bad_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        scheme(**kw)
    assert "\n" not in str(e.value)


def test_odd_head_dim_is_refused():
    with pytest.raises(ConfigError, match="even"):
        Rope(Shape(30, 2, 2, 64, causal=False))  # head dim 15


def test_complex_form_equals_real_form_on_any_layout_and_dtype():
    """apply_rope's complex product (fp32/fp64) and its real form (other dtypes) are the same map,
    on q/k views of a fused qkv projection, on odd-offset slices, and in gradients."""
    g = torch.Generator().manual_seed(4)
    cos, sin = (f(rope_angles(torch.arange(6), rope_inv_freq(8, 10000.0, F64))) for f in (torch.cos, torch.sin))

    def real_form(x):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, odd * cos + even * sin), -1).flatten(-2)

    qkv = torch.randn(2, 6, 3 * 8 + 1, dtype=F64, generator=g, requires_grad=True)
    for x in (qkv[..., :8], qkv[..., 8:16], qkv[..., 1:9], qkv[..., :8].expand(3, -1, -1, -1)):
        torch.testing.assert_close(apply_rope(x, cos, sin), real_form(x), rtol=0, atol=1e-15)
    w = torch.randn(2, 6, 8, dtype=F64, generator=g)
    ours = torch.autograd.grad((apply_rope(qkv[..., 1:9], cos, sin) * w).sum(), qkv)[0]
    ref = torch.autograd.grad((real_form(qkv[..., 1:9]) * w).sum(), qkv)[0]
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-15)
    half = qkv.detach()[..., :8].to(torch.bfloat16)
    torch.testing.assert_close(
        apply_rope(half, cos.to(half.dtype), sin.to(half.dtype)),
        real_form(half.double()).to(torch.bfloat16),
        rtol=2e-2,
        atol=2e-2,
    )


def test_cos_sin_are_built_once_per_length_and_rebuilt_when_positions_or_theta_change():
    """The cache keys on the scheme's own 0 … T−1 tensor by identity (no value is read to compare positions)."""
    rope = scheme()
    own = rope.positions(9)
    assert rope.positions(9) is own  # one tensor per (T, device), handed to every forward
    first = rope.rotary(own)
    assert rope.rotary(rope.positions(9)).cos is first.cos  # the same length: reused, not recomputed
    fresh = rope.rotary(torch.arange(9))  # other positions (a caller's own): computed, never a stale hit
    assert fresh.cos is not first.cos and torch.equal(fresh.cos, first.cos)
    shifted = rope.rotary(torch.arange(1, 10))
    torch.testing.assert_close(shifted.cos, torch.cos(rope_angles(torch.arange(1, 10), rope.inv_freq)))
    rope.inv_freq.mul_(0.5)  # θ changed in place (e.g. a loaded state): angles follow
    torch.testing.assert_close(
        rope.rotary(rope.positions(9)).sin, torch.sin(rope_angles(torch.arange(9), rope.inv_freq)), rtol=0, atol=0
    )
    assert rope.positions(12).numel() == 12 and torch.equal(rope.positions(12), torch.arange(12))


def test_positions_made_under_inference_mode_are_not_kept_for_training():
    """Lightning validates under torch.inference_mode: a new length there (a synthetic task's) made an inference
    tensor the cache kept, and the next training forward failed reading its version counter."""
    rope = scheme()
    with torch.inference_mode():
        rope.rotary(rope.positions(7))
    q = torch.randn(1, 2, 7, rope.shape.head_dim, requires_grad=True)
    rope.rotary(rope.positions(7)).rotate_q(q).sum().backward()
    assert q.grad is not None and not rope.positions(7).is_inference()
