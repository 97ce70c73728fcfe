"""p-RoPE (Barbero et al. 2024): frequencies, p = 1 is RoPE and p = 0 is none exactly, the relative
property, the difference from partial rotary, and parity with Hugging Face's 'proportional' rope type."""

from functools import partial

import pytest
import torch
from torch.testing import assert_close

from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from positional.base import Shape
from positional.none import NoPosition
from positional.p_rope import PRope, p_rope_inv_freq
from positional.rope import Rope, rope_angles, rotated_width
from tests.attn_cases import F64, qkv, rotation_matrices

D = 32


def test_frequencies_keep_the_highest_fraction_and_zero_the_rest():
    for p, k in ((0.25, 4), (0.5, 8), (0.3, 4), (1.0, 16), (0.0, 0), (0.99, 15)):
        want = [10000.0 ** (-2 * i / D) if i < k else 0.0 for i in range(D // 2)]
        got = p_rope_inv_freq(D, p, 10000.0)
        assert got.dtype == F64 and got.tolist() == pytest.approx(want, rel=1e-15, abs=0)


@pytest.mark.parametrize("width", [8, 30, 64, 128])
def test_kept_pairs_round_like_hugging_face(width):
    for p in [i / 20 for i in range(21)] + [1 / 3, 0.7, 0.15]:
        assert rotated_width(width, p) // 2 == int(p * width // 2)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_p_one_is_rope_exactly(layout):
    x = torch.randn(2, 3, 50, D, dtype=F64)
    positions = torch.arange(50)
    ours = PRope(Shape(3 * D, 3, 1, 50, True), p=1.0, layout=layout).rotary(positions).rotate(x)
    assert torch.equal(ours, Rope(Shape(3 * D, 3, 1, 50, True), layout=layout).rotary(positions).rotate(x))


def model(pos, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, d_model=D * 2, n_heads=2, d_ff=64, dropout=0.0)
    return Transformer(cfg, 30, 24, False, pos=pos, attn=partial(Softmax)).eval()


def test_p_zero_is_no_position_and_p_one_is_rope_in_a_whole_model():
    ids = torch.randint(0, 30, (3, 24))
    assert PRope(Shape(D, 1, 1, 8, False), p=0.0).rotary(torch.arange(8)) is None
    assert torch.equal(model(partial(PRope, p=0.0))(ids), model(NoPosition)(ids))
    assert torch.equal(model(partial(PRope, p=1.0))(ids), model(Rope)(ids))
    assert not torch.allclose(model(partial(PRope, p=0.5))(ids), model(Rope)(ids))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_kept_pairs_turn_as_in_rope_and_the_rest_stay_exactly(layout):
    T, p = 20, 0.25
    x = torch.randn(T, D, dtype=F64)
    out = PRope(Shape(D, 1, 1, T, False), p=p, layout=layout).rotary(torch.arange(T)).rotate(x)
    theta = [10000.0 ** (-2 * i / D) for i in range(rotated_width(D, p) // 2)]
    angles = torch.arange(T, dtype=F64)[:, None] * torch.tensor(theta, dtype=F64)  # (T, k)
    R = rotation_matrices(angles.cos(), angles.sin())  # (T, 2k, 2k), pairs (0, 1), (2, 3), …
    k = len(theta)
    pairs = (
        [(2 * i, 2 * i + 1) for i in range(D // 2)]
        if layout == "interleaved"
        else [(i, i + D // 2) for i in range(D // 2)]
    )
    turned = [d for i in range(k) for d in pairs[i]]
    still = [d for i in range(k, D // 2) for d in pairs[i]]
    assert_close(out[:, turned], torch.einsum("tmn,tn->tm", R, x[:, turned]), rtol=0, atol=1e-13)
    assert torch.equal(out[:, still], x[:, still])


def test_removed_pairs_pass_the_rotation_bit_for_bit_in_every_dtype():
    T, k = 17, rotated_width(D, 0.4)
    for dtype in (F64, torch.float32, torch.bfloat16):
        x = torch.randn(2, T, D).to(dtype)
        x[0, 0, -1] = -0.0
        out = PRope(Shape(D, 1, 1, T, False), p=0.4).rotary(torch.arange(T)).rotate(x)
        assert torch.equal(out[..., k:], x[..., k:]) and out[0, 0, -1].item() == 0.0


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_scores_depend_only_on_the_offset(layout):
    q, k, _ = qkv(B=1, H=1, T=10, D=D, seed=4)
    scheme = PRope(Shape(D, 1, 1, 10, False), p=0.5, layout=layout)
    scores = [
        (lambda r: r.rotate(q) @ r.rotate(k).transpose(-1, -2))(scheme.rotary(torch.arange(10) + s))
        for s in (0, 3, 5000)
    ]
    for other in scores[1:]:
        assert_close(other, scores[0], rtol=1e-11, atol=1e-11)


def test_is_not_partial_rotary():
    # both rotate the first 8 pairs at p = fraction = 0.25 (D = 64); the angles differ
    shape = Shape(64, 1, 1, 8, False)
    p_rope = PRope(shape, p=0.25).rotary(torch.arange(8))
    partial_rotary = Rope(shape, fraction=0.25).rotary(torch.arange(8))
    turning = (p_rope.sin[1] != 0).nonzero().flatten().tolist()  # pairs with a non-zero angle at position 1
    assert turning == list(range(8)) and partial_rotary.cos.shape == (8, 8)
    slowest = torch.tensor([10000.0 ** (-14 / 64), 10000.0 ** (-14 / 16)], dtype=F64)  # p-RoPE, partial
    assert_close(torch.atan2(p_rope.sin[1, 7], p_rope.cos[1, 7]).to(F64), slowest[0], rtol=1e-7, atol=0)
    assert_close(torch.atan2(partial_rotary.sin[1, 7], partial_rotary.cos[1, 7]).to(F64), slowest[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("p", [0.25, 0.5, 0.8, 1.0])
def test_matches_hugging_face_proportional_rope(p):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    T = 40
    config = LlamaConfig(
        hidden_size=2 * D,
        num_attention_heads=2,
        head_dim=D,
        rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p},
    )
    hf_theta, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")  # float32
    ours = p_rope_inv_freq(D, p, 10000.0)
    assert torch.equal(hf_theta == 0, ours == 0)  # the same pairs are left unrotated
    assert_close(hf_theta.to(F64), ours, rtol=2e-7, atol=0)  # θ within float32 round-off

    q, k, _ = qkv(B=2, H=2, T=T, D=D, seed=9)
    rot = PRope(Shape(2 * D, 2, 1, T, False), p=p, layout="half").rotary(torch.arange(T))
    angles = rope_angles(torch.arange(T), ours)  # HF's own rotation code, fed float64 angles
    emb = torch.cat((angles, angles), dim=-1)[None]  # (1, T, D), HF's layout of cos, sin
    hf_q, hf_k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    assert_close(rot.rotate(q), hf_q, rtol=0, atol=1e-13)
    assert_close(rot.rotate(k), hf_k, rtol=0, atol=1e-13)
    cos, sin = LlamaRotaryEmbedding(config)(q, torch.arange(T)[None])  # HF end to end: float32 cos, sin
    assert_close(rot.rotate(q), apply_rotary_pos_emb(q, k, cos, sin)[0], rtol=0, atol=2e-5)


@pytest.mark.parametrize("kw", [dict(p=1.5), dict(p=-0.1), dict(layout="zigzag")])
def test_bad_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        PRope(Shape(D, 1, 1, 8, False), **kw)
    assert "\n" not in str(e.value)
