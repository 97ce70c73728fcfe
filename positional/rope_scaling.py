"""RoPE length scaling: new frequencies for evaluation beyond the training length.

Each method maps the trained frequencies θ (R/2,) to θ' and an attention scale, from the
factor s = L'/L (eval length over ``original_max_len`` L). Every method is written as a change
of θ, which is exact: m·θ/s = (m/s)·θ, and a base change b → b' is θ_i → θ_i·(b'/b)^(−2i/R).
So the same code serves fixed and trainable θ (pos=rope_trainable scales its learned θ).

  linear       position interpolation, m → m/s        Chen et al. 2023 (arXiv:2306.15595), §2.3:
                                                      f'(x, m) = f(x, m·L/L')
  ntk          base → base·s^(R/(R−2))                 "NTK-aware"; Peng et al. 2023 (YaRN), §3.1
  dynamic_ntk  ntk with s from the current length      YaRN §3.3 ("Dynamic Scaling"): s = max(1, T/L);
               T = max(position)+1                     yarn_variant=hf adds HF's factor k (see below)
  yarn         NTK-by-parts ramp, plus logits ÷ t      paper: YaRN §3.2 (Def. 2, γ ramp with α, β over
               with √(1/t) = 0.1·ln s + 1              r = L/λ) and §3.4; hf: the authors' code, a ramp
                                                      over the pair index (yarn_hf_inv_freq)
  llama3       Llama 3.1's three wavelength bands      Meta's llama-models ``apply_scaling``; HF "llama3"
  longrope     θ_i/λ_i with searched factors λ, one    LongRoPE (Ding et al. 2024, arXiv:2402.13753);
               set up to L and one beyond it           the switch and attention factor: Phi-3's code

``yarn_variant`` picks, for the two methods of the YaRN paper, its definitions (``paper``, the
default) or those of Hugging Face transformers (``hf``, modeling_rope_utils.ROPE_INIT_FUNCTIONS):
yarn's ramp and its attention scale (HF scales cos and sin, so with partial rotary the pass-through
dims keep their size; the paper divides all of q·k by t, §3.4), and dynamic_ntk's factor
k ≥ 1 (s = k·T/L − (k − 1)). llama3 and longrope follow HF's convention. tests/unit/test_hf_rope_parity.py
compares every method with transformers' own functions.

Configured as one file per method, holding that method's keys only: ``pos/scaling=yarn pos.scaling.factor=4``
picks conf/pos/scaling/yarn.yaml, a partial RopeScaling that Rope completes with its θ (pos/scaling=none,
the default, leaves ``pos.scaling`` null: no scaling).

To evaluate one trained scheme under another scaling, assign ``scheme.scaling`` a new RopeScaling
that keeps the scheme's ``original_max_len``, ``base`` and ``rotated`` (dataclasses.replace does):
Rope holds no scaled state, every forward reads ``scheme.scaling``.

Notation: R rotated width (R/2 frequencies), L original training length, s scale factor, T current length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Literal

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.ranges import Positive, Range, check_fields, show_value


def ntk_inv_freq(inv_freq: Tensor, s: float) -> Tensor:
    """NTK-aware θ'_i = (b·s^(R/(R−2)))^(−2i/R) = θ_i · s^(−2i/(R−2)) (YaRN §3.1). Shape (R/2,)."""
    n = inv_freq.numel()
    i = torch.arange(n, dtype=inv_freq.dtype, device=inv_freq.device)
    return inv_freq * s ** (-2 * i / max(2 * n - 2, 1))  # R = 2n; θ_0 = 1 is never changed


def dynamic_ntk_factor(length: int, original_max_len: int, factor: float = 1.0) -> float:
    """s = k·max(T, L)/L − (k − 1): plain RoPE up to the training length L, NTK beyond it.

    k = 1 is YaRN §3.3's s = max(1, T/L). k > 1 is HF's ``dynamic`` rope type (transformers'
    _compute_dynamic_ntk_parameters, after emozilla's dynamic NTK): s still starts at 1 at T = L
    but grows k times faster with T.
    """
    return factor * max(length, original_max_len) / original_max_len - (factor - 1)


def yarn_inv_freq(inv_freq: Tensor, s: float, original_max_len: int, alpha: float, beta: float) -> Tensor:
    """NTK-by-parts (YaRN §3.2, Def. 2): h(θ_d) = (1 − γ(r_d))·θ_d/s + γ(r_d)·θ_d.

    r_d = L/λ_d with wavelength λ_d = 2π/θ_d (turns per training window); the ramp
    γ(r) = 0 for r < α, 1 for r > β, (r − α)/(β − α) between: slow dims interpolate, fast ones
    keep their angle. α = β is a step at α (Llama 4's llama3 setting: low = high = 1).
    """
    r = original_max_len * inv_freq / (2 * math.pi)
    if alpha == beta:
        return torch.where(r > alpha, inv_freq, inv_freq / s)
    gamma = ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - gamma) * inv_freq / s + gamma * inv_freq


def yarn_attention_scale(s: float, mscale: float = 1.0) -> float:
    """√(1/t) = 0.1·ln(s) + 1 (YaRN §3.4): multiplies q and k, so the logits are divided by t.

    ``mscale`` m gives 0.1·m·ln(s) + 1, the multiplier DeepSeek-V2's YaRN code adds (HF's get_mscale).
    """
    return 0.1 * mscale * math.log(s) + 1.0


def yarn_ramp_bounds(
    rotated: int, base: float, original_max_len: int, alpha: float, beta: float, truncate: bool
) -> tuple[float, float]:
    """The pair indices where the YaRN authors' ramp starts and ends (their find_correction_range).

    Pair i of a base-b RoPE turns r = L/(2π·b^(2i/R)) times in L positions, so the pair turning r
    times is i(r) = R·ln(L/(2πr)) / (2·ln b). The ramp runs from i(β) (faster pairs keep θ) to i(α)
    (slower pairs are interpolated); ``truncate`` widens it to whole pairs (floor, ceil); both ends
    are then clamped to [0, R − 1] as in that code.
    """

    def pair_turning(turns: float) -> float:
        return rotated * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(beta), pair_turning(alpha)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotated - 1)


def yarn_hf_inv_freq(
    inv_freq: Tensor, s: float, original_max_len: int, alpha: float, beta: float, base: float, truncate: bool
) -> Tensor:
    """NTK-by-parts as the YaRN authors' code (jquesnelle/yarn, scaled_rope/LlamaYaRNScaledRotaryEmbedding.py)
    and HF's ``yarn`` compute it: h(θ_i) = (1 − γ_i)·θ_i/s + γ_i·θ_i with γ linear in the pair INDEX i,
    γ_i = 1 − clamp((i − low)/(high − low), 0, 1) between yarn_ramp_bounds.

    Without truncation and clamping, i is linear in ln r, so γ = (ln r − ln α)/(ln β − ln α): the
    paper's ramp (Def. 2) over log-turns instead of turns, the same in the bands and different in
    the transition. The ramp follows the index, so a learned θ keeps its pair's place in it.
    """
    n = inv_freq.numel()
    low, high = yarn_ramp_bounds(2 * n, base, original_max_len, alpha, beta, truncate)
    if high == low:
        high += 0.001  # the authors' guard against an empty ramp
    i = torch.arange(n, dtype=inv_freq.dtype, device=inv_freq.device)
    gamma = 1 - ((i - low) / (high - low)).clamp(0.0, 1.0)  # (R/2,) 1: keep θ, 0: θ/s
    return (1 - gamma) * inv_freq / s + gamma * inv_freq


def _yarn_hf_attention_scale(s: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """HF's YaRN attention factor: √(1/t) of YaRN §3.4, or DeepSeek-V2's ratio
    (0.1·m·ln s + 1)/(0.1·m_all·ln s + 1) when both ``mscale`` m and ``mscale_all_dim`` m_all are given and
    non-zero (HF tests ``if mscale and mscale_all_dim``)."""
    if not (mscale and mscale_all_dim):
        return yarn_attention_scale(s)
    return yarn_attention_scale(s, mscale) / yarn_attention_scale(s, mscale_all_dim)


def _longrope_inv_freq(
    inv_freq: Tensor,
    length: int,
    original_max_len: int,
    short_factor: tuple[float, ...],
    long_factor: tuple[float, ...],
) -> Tensor:
    """θ'_i = θ_i / λ_i with LongRoPE's per-frequency rescale factors λ_i (Ding et al. 2024, found by
    search; θ_i/λ_i is the paper's non-uniform interpolation). λ is ``long_factor`` when the sequence
    is longer than L and ``short_factor`` otherwise: Phi-3's code (Abdin et al. 2024, arXiv:2404.14219)
    and HF switch on T > L.
    """
    lam = long_factor if length > original_max_len else short_factor
    return inv_freq / torch.tensor(lam, dtype=inv_freq.dtype, device=inv_freq.device)


def longrope_attention_scale(s: float, original_max_len: int) -> float:
    """√(1 + ln s / ln L) for s > 1, else 1: Phi-3's default for cos and sin, HF's longrope default."""
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(original_max_len))


@dataclass(frozen=True)
class ScaledFrequencies:
    inv_freq: Tensor  # (R/2,) θ'
    attention_scale: float  # multiplies cos and sin: √(1/t) for YaRN, HF's attention factor; else 1
    pass_through_scale: float = 1.0  # multiplies the dims partial rotary leaves unturned


Method = Callable[["RopeScaling", Tensor, int], ScaledFrequencies]


def _yarn_paper(c: RopeScaling, theta: Tensor, length: int) -> ScaledFrequencies:
    s = yarn_attention_scale(c.factor)  # on the pass-through dims too: all of q·k is divided by t (§3.4)
    return ScaledFrequencies(yarn_inv_freq(theta, c.factor, c.training_length, c.alpha, c.beta), s, s)


def _yarn_hf(c: RopeScaling, theta: Tensor, length: int) -> ScaledFrequencies:
    if c.base is None:
        raise ConfigError(
            "yarn_variant=hf places its ramp by the pair index of a base-b RoPE, but base=None; give "
            "it, or let the scheme that applies this scaling set it"
        )
    scale = (
        c.attention_factor
        if c.attention_factor is not None
        else _yarn_hf_attention_scale(c.factor, c.mscale, c.mscale_all_dim)
    )
    return ScaledFrequencies(
        yarn_hf_inv_freq(theta, c.factor, c.training_length, c.alpha, c.beta, c.base, c.truncate), scale
    )


def _longrope(c: RopeScaling, theta: Tensor, length: int) -> ScaledFrequencies:
    short, long = c.short_factor, c.long_factor
    assert short is not None and long is not None  # method=longrope's check requires both on construction
    if len(short) != theta.numel():
        raise ConfigError(
            f"short_factor/long_factor have {len(short)} entries but this rotation turns "
            f"{2 * theta.numel()} dims; method=longrope needs one factor per frequency"
        )
    scale = (
        c.attention_factor if c.attention_factor is not None else longrope_attention_scale(c.factor, c.training_length)
    )
    return ScaledFrequencies(_longrope_inv_freq(theta, length, c.training_length, short, long), scale)


YARN_VARIANTS: dict[str, Method] = {"paper": _yarn_paper, "hf": _yarn_hf}
METHODS: dict[str, Method] = {
    "none": lambda c, th, t: ScaledFrequencies(th, 1.0),
    "linear": lambda c, th, t: ScaledFrequencies(th / c.factor, 1.0),
    "ntk": lambda c, th, t: ScaledFrequencies(ntk_inv_freq(th, c.factor), 1.0),
    "dynamic_ntk": lambda c, th, t: ScaledFrequencies(
        ntk_inv_freq(th, dynamic_ntk_factor(t, c.training_length, c.factor)), 1.0
    ),
    "yarn": lambda c, th, t: YARN_VARIANTS[c.yarn_variant](c, th, t),
    # Llama 3.1's bands (Meta's llama-models ``apply_scaling``: s = 8, L = 8192, low 1, high 4): wavelengths λ
    # above L/low are divided by s, those below L/high kept, a ramp between. L/λ is YaRN's r, so this is
    # NTK-by-parts with α = low_freq_factor, β = high_freq_factor and no temperature: one ramp serves both.
    "llama3": lambda c, th, t: ScaledFrequencies(
        yarn_inv_freq(th, c.factor, c.training_length, c.low_freq_factor, c.high_freq_factor), 1.0
    ),
    "longrope": _longrope,
}
# The options each method reads besides factor and original_max_len; any other must keep its default.
# conf/pos/scaling/<method>.yaml holds exactly these (tests/unit/test_pos_rope_scaling.py checks it).
OPTIONS_READ: dict[str, tuple[str, ...]] = {
    "none": (),
    "linear": (),
    "ntk": (),
    "dynamic_ntk": ("yarn_variant",),
    "yarn": ("alpha", "beta", "yarn_variant", "truncate", "mscale", "mscale_all_dim", "attention_factor"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor", "attention_factor"),
}
# Methods whose ``factor`` is s = eval length ÷ L (none takes no factor; dynamic_ntk reads s from the length)
LENGTH_RATIO_METHODS = frozenset({"linear", "ntk", "yarn", "llama3", "longrope"})
HF_YARN_OPTIONS = ("truncate", "mscale", "mscale_all_dim", "attention_factor")  # fields of HF's yarn, not the paper's


@dataclass(frozen=True)
class RopeScaling:
    """A length scaling ``method`` with its options (conf/pos/scaling/<method>.yaml, one file per method),
    validated on construction; errors name these fields.

    ``original_max_len``, ``base`` and ``rotated`` describe the θ being scaled, and Rope sets them: its
    training length (unless given), its base and its rotated width R (yarn_variant=hf places its ramp by a
    base-b RoPE's pair index; longrope's lists need R/2 entries). Left None, the first two are refused
    where they are needed and the width is checked when θ arrives.
    """

    method: str = "none"
    factor: Annotated[float, Range("≥ 1 (eval length ÷ training length)", ge=1)] = 1.0
    alpha: float = 1.0
    beta: float = 32.0
    original_max_len: Annotated[int, Range("a positive number of tokens", ge=1)] | None = None
    yarn_variant: Literal["paper", "hf"] = "paper"  # YARN_VARIANTS
    truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: Annotated[float, Range("> 0, or null for the derived one", gt=0)] | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    base: Positive | None = None  # the θ being scaled is base^(−2i/R)
    rotated: int | None = None

    def __post_init__(self):
        for name in ("short_factor", "long_factor"):  # Hydra hands lists over as ListConfig: keep plain tuples
            object.__setattr__(self, name, _float_tuple(name, getattr(self, name)))
        if self.method not in METHODS:
            raise ConfigError(f"method={self.method!r}: use one of {', '.join(METHODS)}")
        self._check_common()
        self._check_unread_options()
        CHECKS.get(self.method, lambda c: None)(self)

    def _check_common(self) -> None:
        check_fields(self, "")  # types, finiteness and the ranges above
        if not 0 <= self.alpha < self.beta:
            raise ConfigError(f"alpha={self.alpha}, beta={self.beta}: need 0 ≤ alpha < beta")
        if self.rotated is not None and (self.rotated <= 0 or self.rotated % 2):
            raise ConfigError(f"rotated={self.rotated}: the rotated width must be a positive even number")

    def _check_unread_options(self) -> None:
        for name in sorted({n for read in OPTIONS_READ.values() for n in read} - set(OPTIONS_READ[self.method])):
            value = getattr(self, name)
            if value != DEFAULTS[name]:
                readers = "/".join(m for m, read in OPTIONS_READ.items() if name in read)
                raise ConfigError(
                    f"{name}={show_value(value)} is unused by method={self.method}; drop it (or leave it "
                    f"at {show_value(DEFAULTS[name])}), or use method={readers}"
                )

    def frequencies(self, inv_freq: Tensor, length: int) -> ScaledFrequencies:
        """θ' for a sequence of ``length`` positions (dynamic_ntk and longrope read the length); a formula with an
        L in it refuses an unknown one (``training_length``)."""
        return METHODS[self.method](self, inv_freq, length)

    @property
    def training_length(self) -> int:
        """L, ``original_max_len``, which the formulas with an L in them read (Rope sets it)."""
        if self.original_max_len is None:
            raise ConfigError(
                f"method={self.method} scales from the training length, but original_max_len=None; "
                "give it, or let the scheme that applies this scaling set it"
            )
        return self.original_max_len


def scaling_for(configured: RopeScaling, method: str, factor: float) -> RopeScaling:
    """``method`` at factor s for the θ ``configured`` scales (its L, base and rotated width), with the options
    ``method`` reads taken from ``configured`` and the others at their defaults (eval.scalings: one trained model,
    every scaling). Methods that take no s (none, dynamic_ntk) get factor 1, except the configured method itself:
    HF's dynamic NTK (yarn_variant=hf) reads its own k from ``factor``, which must reach the scaled model."""
    if method not in LENGTH_RATIO_METHODS:
        factor = configured.factor if method == configured.method else 1.0
    return RopeScaling(
        method=method,
        factor=factor,
        original_max_len=configured.original_max_len,
        base=configured.base,
        rotated=configured.rotated,
        **{name: getattr(configured, name) for name in OPTIONS_READ[method]},
    )


def as_field_of(argument: str, message: str) -> str:
    """A RopeScaling error worded as the field of a scheme's ``argument``: ``factor=0 …`` -> ``scaling.factor=0 …``,
    the way a scheme's caller names it (and the harness, ``pos.scaling.factor=0 …``)."""
    names = "|".join(f.name for f in fields(RopeScaling))
    return re.sub(rf"(?<![\w.])({names})=", rf"{argument}.\1=", message)


DEFAULTS = {f.name: f.default for f in fields(RopeScaling)}  # what an option a method does not read must keep


def _float_tuple(name: str, values) -> tuple[float, ...] | None:
    if values is None:
        return None
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={values!r} must be a list of numbers, one per frequency") from None


def _check_none(c: RopeScaling) -> None:
    if c.factor != 1:
        raise ConfigError(f"factor={c.factor} is unused by method=none; use factor=1 or another method")


def _check_dynamic_ntk(c: RopeScaling) -> None:
    if c.factor != 1 and c.yarn_variant == "paper":
        raise ConfigError(
            f"factor={c.factor} is unused by method=dynamic_ntk as YaRN §3.3 defines it (s comes from "
            "the length); use factor=1, or yarn_variant=hf for HF's factor"
        )


def _check_yarn(c: RopeScaling) -> None:
    if c.yarn_variant == "paper":
        for name in HF_YARN_OPTIONS:
            if getattr(c, name) != DEFAULTS[name]:
                raise ConfigError(
                    f"{name}={getattr(c, name)} is a field of HF's YaRN; use yarn_variant=hf or leave "
                    f"it at {DEFAULTS[name]}"
                )
        return
    if c.base is not None and not c.base > 1:
        raise ConfigError(
            f"yarn_variant=hf places its ramp by the pair index of a base-b RoPE, so it needs a base > 1 (got {c.base})"
        )
    if not c.alpha > 0:
        raise ConfigError("alpha=0 with yarn_variant=hf: HF reads beta_slow=0 as unset (1); use alpha > 0")
    pair = (c.mscale, c.mscale_all_dim)
    if (pair[0] is None) != (pair[1] is None) or any(m is not None and not m > 0 for m in pair):
        raise ConfigError(
            f"mscale={c.mscale} and mscale_all_dim={c.mscale_all_dim} go together (DeepSeek-V2's "
            "pair): set both > 0 or neither"
        )
    if c.mscale is not None and c.attention_factor is not None:
        raise ConfigError(
            f"attention_factor={c.attention_factor} replaces the scale mscale={c.mscale} and "
            f"mscale_all_dim={c.mscale_all_dim} would give; set one"
        )


def _check_llama3(c: RopeScaling) -> None:
    if not 0 < c.low_freq_factor <= c.high_freq_factor:
        raise ConfigError(
            f"low_freq_factor={c.low_freq_factor}, high_freq_factor={c.high_freq_factor}: "
            "llama3 needs 0 < low_freq_factor ≤ high_freq_factor"
        )


def _check_longrope(c: RopeScaling) -> None:
    if c.short_factor is None or c.long_factor is None:
        raise ConfigError(
            f"method=longrope needs short_factor=[...] and long_factor=[...], one factor per frequency "
            f"(got short_factor={c.short_factor}, long_factor={c.long_factor})"
        )
    need = {len(c.long_factor)} if c.rotated is None else {c.rotated // 2}
    if {len(c.short_factor), len(c.long_factor)} != need:
        want = "as many as the other" if c.rotated is None else f"{c.rotated // 2} each (rotated dims ÷ 2)"
        raise ConfigError(
            f"short_factor has {len(c.short_factor)} entries and long_factor {len(c.long_factor)}: "
            f"method=longrope needs {want}, one per frequency"
        )
    if not all(v > 0 and math.isfinite(v) for v in c.short_factor + c.long_factor):
        raise ConfigError(
            f"short_factor={list(c.short_factor)}, long_factor={list(c.long_factor)}: each entry "
            "divides a frequency, so every one must be a finite number > 0"
        )
    if c.original_max_len is not None and c.original_max_len < 2:
        raise ConfigError(f"original_max_len={c.original_max_len}: longrope's attention factor needs ln L > 0")


CHECKS: dict[str, Callable[[RopeScaling], None]] = {
    "none": _check_none,
    "dynamic_ntk": _check_dynamic_ntk,
    "yarn": _check_yarn,
    "llama3": _check_llama3,
    "longrope": _check_longrope,
}
