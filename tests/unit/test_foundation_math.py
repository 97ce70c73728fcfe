"""Maths of the foundation's schemes and objectives, against reference forms in float64."""

import math

import numpy as np
import pytest
import torch

from harness.data.objectives import IGNORE, CausalLM, MaskedLM
from harness.data.tokenizer import ByteTokenizer
from harness.errors import ConfigError
from positional.base import PositionalScheme, RelativeBias, Shape
from positional.learned import Learned
from positional.rope import Rope, apply_rope, rope_angles, rope_inv_freq
from positional.sinusoidal import Sinusoidal, sinusoidal_table


@pytest.fixture(autouse=True)
def float64():
    """References in float64, for this module's tests only (a module-level default would leak
    into every test collected after it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def shape(d_model=64, n_heads=2, max_len=32, causal=False):
    return Shape(d_model=d_model, n_heads=n_heads, n_layers=2, max_len=max_len, causal=causal)


def rotate_at(x: torch.Tensor, m: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv = rope_inv_freq(head_dim, base, torch.float64)
    ang = rope_angles(torch.tensor([m]), inv)
    return apply_rope(x[None], ang.cos(), ang.sin())[0]


def test_rope_score_depends_only_on_offset():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 64, generator=g)
    for offset in (-7, 0, 3, 50):
        scores = [rotate_at(q, m, 64) @ rotate_at(k, m - offset, 64) for m in (60, 100, 1000, 4096)]
        for s in scores[1:]:
            assert abs(float(s - scores[0])) < 1e-10


def test_rope_matches_explicit_block_rotation_and_preserves_norm():
    """R^d_{Θ,m} of RoFormer Eq. 13, built as a dense block-diagonal matrix."""
    d, m, base = 8, 5, 10000.0
    x = torch.randn(d, generator=torch.Generator().manual_seed(1))
    R = torch.zeros(d, d)
    for i in range(d // 2):
        a = m * base ** (-2 * i / d)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
        )
    torch.testing.assert_close(rotate_at(x, m, d), R @ x, rtol=0, atol=1e-12)
    assert float(rotate_at(x, 123, d).norm()) == pytest.approx(float(x.norm()), abs=1e-12)


def test_rope_scheme_rotates_every_position_and_refuses_odd_head_dim():
    rope = Rope(shape(d_model=16, n_heads=2))
    x = torch.randn(1, 2, 6, 8)
    rot = rope.rotary(torch.arange(6))
    y = rot.rotate(x)
    torch.testing.assert_close(y[0, 1, 4], rotate_at(x[0, 1, 4], 4, 8))
    assert rot.at_width(12).rotate(torch.randn(6, 12)).shape == (6, 12)
    with pytest.raises(ConfigError, match="not a positive even integer"):
        Rope(shape(d_model=6, n_heads=2))


def test_sinusoidal_table_against_formula():
    pos = torch.arange(50)
    table = sinusoidal_table(pos, 16)
    for m in (0, 1, 17, 49):
        for i in range(8):
            assert float(table[m, 2 * i]) == pytest.approx(math.sin(m / 10000 ** (2 * i / 16)), abs=1e-12)
            assert float(table[m, 2 * i + 1]) == pytest.approx(math.cos(m / 10000 ** (2 * i / 16)), abs=1e-12)
    x = torch.zeros(2, 50, 16)
    torch.testing.assert_close(Sinusoidal(shape(d_model=16)).embed(x, pos), table.expand(2, 50, 16))
    e = torch.randn(2, 50, 16, dtype=torch.float64)  # Vaswani §3.4: embeddings × √d_model, then + PE
    torch.testing.assert_close(Sinusoidal(shape(d_model=16)).embed(e, pos), e * 4.0 + table, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        Sinusoidal(shape(d_model=16), scale_embeddings=False).embed(e, pos), e + table, rtol=0, atol=1e-12
    )


def test_learned_adds_its_table_and_refuses_beyond_it():
    scheme = Learned(shape(d_model=8, n_heads=2, max_len=10))
    x = torch.zeros(1, 10, 8)
    torch.testing.assert_close(scheme.embed(x, torch.arange(10))[0], scheme.table.weight)
    with pytest.raises(ConfigError, match="positions"):
        scheme.embed(torch.zeros(1, 11, 8), torch.arange(11))


def test_hook_declarations_are_derived_from_overrides():
    assert PositionalScheme.hooks() == frozenset()
    assert Rope.hooks() == {"rotary"}
    assert Learned.hooks() == {"embed"} and Sinusoidal.hooks() == {"embed"}


def test_relative_bias_dense_is_toeplitz():
    table = torch.randn(3, 4 + 5 - 1)
    dense = RelativeBias(table, t_q=4, t_k=5).dense()
    for i in range(4):
        for j in range(5):
            torch.testing.assert_close(dense[0, :, i, j], table[:, i - j + 4])


# --- objectives --------------------------------------------------------------------


def test_mlm_masking_proportions():
    """BERT: 15 % selected; of those 80 % [MASK], 10 % random, 10 % unchanged."""
    tok = ByteTokenizer()
    mlm = MaskedLM(tok)
    gen = torch.Generator().manual_seed(0)
    window = torch.randint(256, (200_000,), generator=gen)
    ex = mlm.make_example(window, torch.ones_like(window, dtype=torch.bool), gen)
    selected = ex["labels"] != IGNORE
    n = int(selected.sum())
    assert n / window.numel() == pytest.approx(0.15, abs=0.003)
    masked = (ex["input_ids"] == tok.mask_id) & selected
    kept = (ex["input_ids"] == window) & selected
    changed = selected & ~masked & ~kept
    assert int(masked.sum()) / n == pytest.approx(0.8, abs=0.01)
    # a random replacement equals the original 1/256 of the time; count those as "random" too
    random_share = (int(changed.sum()) / n) * 256 / 255
    assert random_share == pytest.approx(0.1, abs=0.01)
    assert ((ex["input_ids"] != window) & ~selected).sum() == 0  # unselected tokens untouched
    torch.testing.assert_close(ex["labels"][selected], window[selected])


def test_mlm_never_selects_padding_and_rejects_bad_probability():
    tok = ByteTokenizer()
    window = torch.full((64,), tok.pad_id)
    window[:10] = 65
    valid = torch.arange(64) < 10
    ex = MaskedLM(tok, mask_prob=0.9).make_example(window, valid, torch.Generator().manual_seed(0))
    assert (ex["labels"][~valid] == IGNORE).all() and (ex["labels"][valid] != IGNORE).any()
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="mask_prob"):
            MaskedLM(tok, mask_prob=bad)


def test_clm_shifts_labels_by_one():
    window = torch.arange(10)
    ex = CausalLM(ByteTokenizer()).make_example(window, torch.ones(10, dtype=torch.bool), torch.Generator())
    torch.testing.assert_close(ex["input_ids"], window[:-1])
    torch.testing.assert_close(ex["labels"], window[1:])


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    ids = tok.encode("héllo".encode())
    assert ids.dtype == np.uint8 and tok.decode(ids) == "héllo"
    assert tok.vocab_size == 258 and {tok.pad_id, tok.mask_id} == {256, 257}
