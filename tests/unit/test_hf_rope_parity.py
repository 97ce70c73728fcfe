"""RoPE scalings against Hugging Face transformers' own functions (modeling_rope_utils.ROPE_INIT_FUNCTIONS).

transformers builds θ in float32 whatever the caller asks (``torch.float``, ``.float()``, float32
ramps), so each case calls HF's function twice:
  float64  its float32 swapped for float64 (the module's ``torch`` seen through a proxy whose
           ``float``/``float32`` are float64, and ``Tensor.float`` → ``double`` for the call); the
           result is asserted float64, then θ' must agree to 1e-12 relative and the attention
           factor to 1e-12 absolute: the formulas are the same, not just close (`pytest -s` prints
           the largest differences per method);
  float32  as shipped, within F32_RTOL of posbench's float64 θ' (the rounding float32 permits).
posbench ↔ HF keys: original_max_len ↔ original_max_position_embeddings (max_position_embeddings for
dynamic), alpha/beta ↔ beta_slow/beta_fast, fraction ↔ partial_rotary_factor, base ↔ rope_theta.
"""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import pytest
import torch
import transformers.modeling_rope_utils as hf_rope  # the `test` extra installs transformers
from transformers import PretrainedConfig

from positional.base import Shape
from positional.rope import Rope, rope_inv_freq, rotated_width
from positional.rope_scaling import RopeScaling, ScaledFrequencies
from tests.helpers import rope_args

F64 = torch.float64
RTOL = 1e-12
# HF's float32 path rounds i/R (2^-24 relative) before b^(i/R) amplifies it by up to ln b' ≈ 18 (b' = 500000
# after a ×128 dynamic base change), and its float32 ramp weights then mix θ with θ/s (×(s − 1) ≤ 15
# relative to θ'): 2^-24 · 64 ≈ 3.8e-6 bounds both with room.
F32_RTOL = 64 * 2.0**-24
HEADS = [(32, 1.0), (96, 1.0), (128, 1.0), (128, 0.5)]  # (head dim D, rotary fraction); 96: i/R not exact
BASES = [10000.0, 500000.0]
FACTORS = [2.0, 4.0, 8.0, 16.0, 2.5, 6.25]  # 6.25·L and 2.5·L stay whole lengths
ORIGINAL = [128, 1024, 8192]  # L: 128 puts YaRN's fast end below pair 0 (clamped); 8192 is Llama 3's


class _Float64Torch:
    """``torch`` as modeling_rope_utils sees it inside ``hf_float64``: float and float32 mean float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def hf_float64():
    with (
        mock.patch.object(hf_rope, "torch", _Float64Torch()),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        yield


def hf_config(head_dim: int, fraction: float, base: float, max_pos: int, **rope) -> PretrainedConfig:
    parameters = dict(rope_theta=base, partial_rotary_factor=fraction, **rope)
    return PretrainedConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=parameters,
    )


def hf_both(config: PretrainedConfig, seq_len: int | None) -> tuple[tuple[torch.Tensor, float], torch.Tensor]:
    """HF's (θ', attention factor) in float64, and its θ' as shipped (float32)."""
    fn = hf_rope.ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]]
    with hf_float64():
        theta64, factor = fn(config, seq_len=seq_len)
    assert theta64.dtype == F64  # a float32 step left inside would also show as a ~1e-7 difference below
    theta32, factor32 = fn(config, seq_len=seq_len)
    assert theta32.dtype == torch.float32 and factor32 == factor
    return (theta64, factor), theta32


def ours(head_dim: int, fraction: float, base: float, length: int, **scaling) -> ScaledFrequencies:
    r = rotated_width(head_dim, fraction)
    return RopeScaling(base=base, rotated=r, **scaling).frequencies(rope_inv_freq(r, base, F64), length)


DIFFS: dict[str, list[float]] = {}  # method -> [max |Δθ'|, max |Δθ'|/θ', max |Δ attention|, max f32 |Δθ'|/θ']


def compare(method: str, got: ScaledFrequencies, config: PretrainedConfig, seq_len: int | None) -> None:
    (want, factor), want32 = hf_both(config, seq_len)
    rel = ((got.inv_freq - want).abs() / want).max().item()
    rel32 = ((got.inv_freq - want32.to(F64)).abs() / got.inv_freq).max().item()
    assert rel <= RTOL and abs(got.attention_scale - factor) <= 1e-12 and rel32 <= F32_RTOL, (
        method,
        config.rope_parameters,
        seq_len,
        rel,
        got.attention_scale,
        factor,
        rel32,
    )
    row = [(got.inv_freq - want).abs().max().item(), rel, abs(got.attention_scale - factor), rel32]
    DIFFS[method] = [max(a, b) for a, b in zip(DIFFS.get(method, row), row, strict=True)]


@pytest.fixture(scope="module", autouse=True)
def print_max_differences():
    yield
    for method, (d, rel, att, rel32) in sorted(DIFFS.items()):
        print(
            f"\nHF parity {method:12s} max|Δθ'| {d:.2e}  max|Δθ'|/θ' {rel:.2e}  max|Δattn| {att:.2e}  "
            f"float32 HF max|Δθ'|/θ' {rel32:.2e}"
        )


@pytest.fixture(params=HEADS, ids=lambda h: f"D{h[0]}x{h[1]}")
def head(request):
    return request.param


@pytest.fixture(params=BASES, ids=lambda b: f"base{b:g}")
def base(request):
    return request.param


def test_linear_is_hf_linear(head, base):
    for s in FACTORS:
        got = ours(*head, base, 1, method="linear", factor=s)
        compare("linear", got, hf_config(*head, base, 1024, rope_type="linear", factor=s), None)


def test_ntk_is_hf_dynamic_at_the_length_s_times_l(head, base):
    """HF has no static NTK; its ``dynamic`` with factor 1 at T = s·L is NTK with s (YaRN §3.1)."""
    for s in FACTORS:
        for L in ORIGINAL:
            got = ours(*head, base, 1, method="ntk", factor=s, original_max_len=L)
            compare("ntk", got, hf_config(*head, base, L, rope_type="dynamic", factor=1.0), int(s * L))


def test_dynamic_ntk_hf_takes_hfs_factor(head, base):
    for k in [1.0, *FACTORS]:
        for L in ORIGINAL:
            for length in (L // 2, L, 3 * L, 8 * L + 5):  # below, at and above L
                got = ours(*head, base, length, method="dynamic_ntk", yarn_variant="hf", factor=k, original_max_len=L)
                compare("dynamic_ntk", got, hf_config(*head, base, L, rope_type="dynamic", factor=k), length)


YARN_OPTIONS = [
    dict(),
    dict(truncate=False),
    dict(alpha=2.0, beta=16.0, mscale=1.0, mscale_all_dim=0.5),
    dict(alpha=0.5, beta=64.0, truncate=False, attention_factor=1.3),
]


def yarn_hf_keys(alpha=1.0, beta=32.0, **rest) -> dict:
    return dict(beta_slow=alpha, beta_fast=beta, **rest)


def test_yarn_hf_is_hf_yarn(head, base):
    for s in FACTORS:
        for L in ORIGINAL:
            for options in YARN_OPTIONS:
                got = ours(*head, base, 1, method="yarn", yarn_variant="hf", factor=s, original_max_len=L, **options)
                config = hf_config(
                    *head,
                    base,
                    int(s * L),
                    rope_type="yarn",
                    factor=s,
                    original_max_position_embeddings=L,
                    **yarn_hf_keys(**options),
                )
                compare("yarn (hf)", got, config, None)


# yarn keys of a config.json that transformers reads as unset: null or 0 betas (`or 32`, `or 1`), an mscale without
# its mscale_all_dim (or beside an attention_factor), a null factor (then max_position_embeddings ÷ original)
YARN_UNSET_KEYS = [
    dict(factor=None),
    dict(beta_fast=None, beta_slow=None),
    dict(beta_fast=0, beta_slow=0),
    dict(mscale=0.707),
    dict(mscale=1.0, mscale_all_dim=0),
    dict(mscale=1.0, mscale_all_dim=0.5, attention_factor=1.2),
]


@pytest.mark.parametrize("keys", YARN_UNSET_KEYS, ids=lambda k: ",".join(f"{n}={v}" for n, v in k.items()))
def test_a_configs_yarn_keys_are_read_as_hf_reads_them(keys):
    from harness.pretrained.rotary import scaling_of

    L, D = 1024, 128
    config = hf_config(
        D, 1.0, 10000.0, 4 * L, rope_type="yarn", original_max_position_embeddings=L, **{"factor": 4.0, **keys}
    )
    scaling = scaling_of(config)
    compare("yarn (config)", scaling.frequencies(rope_inv_freq(D, 10000.0, F64), 1), config, None)


def test_llama3_is_hf_llama3(head, base):
    for s in FACTORS:
        for L in ORIGINAL:
            for low, high in ((1.0, 4.0), (2.0, 32.0)):  # Meta's, and one with the bands elsewhere
                got = ours(
                    *head,
                    base,
                    1,
                    method="llama3",
                    factor=s,
                    original_max_len=L,
                    low_freq_factor=low,
                    high_freq_factor=high,
                )
                config = hf_config(
                    *head,
                    base,
                    int(s * L),
                    rope_type="llama3",
                    factor=s,
                    low_freq_factor=low,
                    high_freq_factor=high,
                    original_max_position_embeddings=L,
                )
                compare("llama3", got, config, None)


def longrope_lists(n: int, s: float, seed: int) -> tuple[list[float], list[float]]:
    """Searched-looking factors: short ones near 1, long ones growing from 1 to about s."""
    g = torch.Generator().manual_seed(seed)
    short = (1 + 0.2 * torch.rand(n, generator=g, dtype=F64)).tolist()
    long = 1 + (s - 1) * torch.linspace(0, 1, n, dtype=F64) ** 2 * (0.5 + torch.rand(n, generator=g, dtype=F64))
    return short, long.tolist()


def test_longrope_is_hf_longrope(head, base):
    n = rotated_width(*head) // 2
    for seed, s in enumerate(FACTORS):
        short, long = longrope_lists(n, s, seed)
        for L in ORIGINAL:
            for extra in (dict(), dict(attention_factor=1.1)):
                for length in (L, L + 1):  # HF switches to long_factor at T > L
                    got = ours(
                        *head,
                        base,
                        length,
                        method="longrope",
                        factor=s,
                        original_max_len=L,
                        short_factor=short,
                        long_factor=long,
                        **extra,
                    )
                    config = hf_config(
                        *head,
                        base,
                        int(s * L),
                        rope_type="longrope",
                        factor=s,
                        short_factor=short,
                        long_factor=long,
                        original_max_position_embeddings=L,
                        **extra,
                    )
                    compare("longrope", got, config, length)


@pytest.mark.parametrize("factor", [None, 0.5], ids=["derived", "given"])
def test_a_configs_longrope_factor_below_1_is_read_as_hf_reads_it(factor):
    """max_position_embeddings below the original (a factor of 0.5 derived), or a factor of 0.5 given: transformers
    takes attention factor 1, as for any factor ≤ 1, and switches factor lists at the original length as always."""
    from harness.pretrained.rotary import scaling_of

    L, D = 1024, 64
    short, long = longrope_lists(D // 2, 4.0, 0)
    keys = dict(short_factor=short, long_factor=long, original_max_position_embeddings=L)
    config = hf_config(D, 1.0, 10000.0, L // 2, rope_type="longrope", **keys, **({"factor": factor} if factor else {}))
    for length in (L, L + 1):
        compare(
            "longrope (config)", scaling_of(config).frequencies(rope_inv_freq(D, 10000.0, F64), length), config, length
        )


# ---- end to end: a Rope module in eval mode rotates by positions × HF's θ', scaled by HF's factor -------------


def e2e_cases(D: int, L: int):
    """(posbench pos.* options, HF rope_parameters, HF max_position_embeddings) for each new scaling."""
    short, long = longrope_lists(D // 4, 4.0, 0)  # fraction 0.5: R/2 = D/4 frequencies
    return [
        (
            dict(scaling="llama3", factor=4.0),
            dict(
                rope_type="llama3",
                factor=4.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=L,
            ),
            4 * L,
        ),
        (
            dict(scaling="yarn", yarn_variant="hf", factor=4.0),
            dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=L),
            4 * L,
        ),
        (dict(scaling="dynamic_ntk", yarn_variant="hf", factor=3.0), dict(rope_type="dynamic", factor=3.0), L),
        (
            dict(scaling="longrope", factor=4.0, short_factor=short, long_factor=long),
            dict(
                rope_type="longrope",
                factor=4.0,
                short_factor=short,
                long_factor=long,
                original_max_position_embeddings=L,
            ),
            4 * L,
        ),
    ]


@pytest.mark.parametrize("case", range(4), ids=["llama3", "yarn_hf", "dynamic_hf", "longrope"])
def test_rope_module_rotates_by_hfs_angles_and_leaves_pass_through_dims(case):
    D, L = 32, 64
    ours_options, rope, max_pos = e2e_cases(D, L)[case]
    module = Rope(Shape(2 * D, 2, 2, L, causal=False), **rope_args(fraction=0.5, **ours_options)).double().eval()
    x = torch.randn(2, 3 * L, D, dtype=F64, generator=torch.Generator().manual_seed(case))
    for length in (L // 2, 3 * L):  # longrope's short and long sets, dynamic's plain and scaled θ
        positions = torch.arange(length)
        (theta, factor), _ = hf_both(hf_config(D, 0.5, 10000.0, max_pos, **rope), length)
        rot = module.rotary(positions)
        angles = positions.to(F64)[:, None] * theta[None, :]  # (T, R/2)
        torch.testing.assert_close(rot.cos, angles.cos() * factor, rtol=0, atol=1e-12)
        torch.testing.assert_close(rot.sin, angles.sin() * factor, rtol=0, atol=1e-12)
        out = rot.rotate(x[:, :length])
        assert torch.equal(out[..., D // 2 :], x[:, :length, D // 2 :])  # HF scales cos and sin only
        torch.testing.assert_close(out[..., : D // 2].norm(dim=-1), x[:, :length, : D // 2].norm(dim=-1) * factor)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_hfs_update_path_picks_the_frequencies_posbench_picks_at_each_length(rope_type):
    """LlamaRotaryEmbedding's forward (dynamic_rope_update) re-derives θ from max(position)+1, as posbench does.

    A fresh module per length: HF keeps the θ of the longest sequence it has seen until one shorter
    than L resets it, posbench derives θ from the current length alone (a pure function).
    """
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # slow to import: only here

    D, L, s = 64, 256, 4.0
    short, long = longrope_lists(D // 2, s, 1)
    rope = (
        dict(rope_type="dynamic", factor=2.0)
        if rope_type == "dynamic"
        else dict(
            rope_type="longrope", factor=s, short_factor=short, long_factor=long, original_max_position_embeddings=L
        )
    )
    scaling = (
        dict(method="dynamic_ntk", yarn_variant="hf", factor=2.0)
        if rope_type == "dynamic"
        else dict(method="longrope", factor=s, short_factor=short, long_factor=long)
    )
    for length in (L // 2, L, L + 1, 5 * L):
        hf = LlamaRotaryEmbedding(hf_config(D, 1.0, 10000.0, L if rope_type == "dynamic" else int(s * L), **rope))
        hf(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
        got = ours(D, 1.0, 10000.0, length, original_max_len=L, **scaling)
        torch.testing.assert_close(hf.inv_freq.to(F64), got.inv_freq, rtol=F32_RTOL, atol=0)
        assert hf.attention_scaling == pytest.approx(got.attention_scale, rel=1e-12)


def test_the_float64_swap_changes_only_the_dtype():
    """The float64 run of HF's code is its float32 run to float32 precision: the proxy changes no formula."""
    config = hf_config(128, 1.0, 500000.0, 4096, rope_type="yarn", factor=8.0, original_max_position_embeddings=512)
    (theta64, _), theta32 = hf_both(config, None)
    torch.testing.assert_close(theta32.to(F64), theta64, rtol=F32_RTOL, atol=0)
    assert not torch.equal(theta32.to(F64), theta64)  # and it did compute in float64
    assert math.isclose(hf_rope.ROPE_INIT_FUNCTIONS["yarn"](config)[1], 0.1 * math.log(8.0) + 1, rel_tol=1e-15)
