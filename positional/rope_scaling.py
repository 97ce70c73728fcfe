"""RoPE length scaling: new frequencies for evaluation beyond the training length.

Each method maps the trained frequencies θ (R/2,) to θ' and an attention scale, from the
factor s = L'/L (eval length over ``original_max_len`` L). Every method is written as a change
of θ, which is exact: m·θ/s = (m/s)·θ, and a base change b → b' is θ_i → θ_i·(b'/b)^(−2i/R).
So the same code serves fixed and trainable θ (pos=rope_trainable scales its learned θ).

  linear       position interpolation, m → m/s        Chen et al. 2023 (arXiv:2306.15595), §2.3:
                                                      f'(x, m) = f(x, m·L/L')
  ntk          base → base·s^(R/(R−2))                 "NTK-aware"; Peng et al. 2023 (YaRN), §3.1
  dynamic_ntk  ntk with s = max(1, T/L) from the       YaRN §3.3 ("Dynamic Scaling"); T is the
               current length T = max(position)+1      length of the sequence being evaluated
  yarn         NTK-by-parts ramp over wavelengths,     YaRN §3.2 (Def. 2, γ ramp with α, β) and
               plus logits ÷ t with √(1/t)=0.1·ln s+1  §3.4 (temperature applied to q and k)

Notation: R rotated width (R/2 frequencies), L original training length, s scale factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.errors import ConfigError


def ntk_inv_freq(inv_freq: Tensor, s: float) -> Tensor:
    """NTK-aware θ'_i = (b·s^(R/(R−2)))^(−2i/R) = θ_i · s^(−2i/(R−2)) (YaRN §3.1). Shape (R/2,)."""
    n = inv_freq.numel()
    i = torch.arange(n, dtype=inv_freq.dtype, device=inv_freq.device)
    return inv_freq * s ** (-2 * i / max(2 * n - 2, 1))  # R = 2n; θ_0 = 1 is never changed


def dynamic_ntk_factor(length: int, original_max_len: int) -> float:
    """s = max(1, T/L) (YaRN §3.3): plain RoPE up to the training length, NTK beyond it.

    Not the variant with a configured factor, s' = s·T/L − (s − 1), that some libraries ship.
    """
    return max(1.0, length / original_max_len)


def yarn_inv_freq(inv_freq: Tensor, s: float, original_max_len: int, alpha: float, beta: float) -> Tensor:
    """NTK-by-parts (YaRN §3.2, Def. 2): h(θ_d) = (1 − γ(r_d))·θ_d/s + γ(r_d)·θ_d.

    r_d = L/λ_d with wavelength λ_d = 2π/θ_d (turns per training window); the ramp
    γ(r) = 0 for r < α, 1 for r > β, (r − α)/(β − α) between: slow dims interpolate, fast ones
    keep their angle.
    """
    r = original_max_len * inv_freq / (2 * math.pi)
    gamma = ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - gamma) * inv_freq / s + gamma * inv_freq


def yarn_attention_scale(s: float) -> float:
    """√(1/t) = 0.1·ln(s) + 1 (YaRN §3.4): multiplies q and k, so the logits are divided by t."""
    return 0.1 * math.log(s) + 1.0


@dataclass(frozen=True)
class ScaledFrequencies:
    inv_freq: Tensor  # (R/2,) θ'
    attention_scale: float  # √(1/t), 1 except for YaRN


Method = Callable[["RopeScaling", Tensor, int], ScaledFrequencies]
METHODS: dict[str, Method] = {
    "none": lambda c, th, t: ScaledFrequencies(th, 1.0),
    "linear": lambda c, th, t: ScaledFrequencies(th / c.factor, 1.0),
    "ntk": lambda c, th, t: ScaledFrequencies(ntk_inv_freq(th, c.factor), 1.0),
    "dynamic_ntk": lambda c, th, t: ScaledFrequencies(
        ntk_inv_freq(th, dynamic_ntk_factor(t, c.original_max_len)), 1.0),
    "yarn": lambda c, th, t: ScaledFrequencies(
        yarn_inv_freq(th, c.factor, c.original_max_len, c.alpha, c.beta), yarn_attention_scale(c.factor)),
}


@dataclass(frozen=True)
class RopeScaling:
    """conf/pos rope keys ``scaling factor alpha beta original_max_len``, validated."""

    method: str = "none"
    factor: float = 1.0
    alpha: float = 1.0
    beta: float = 32.0
    original_max_len: int = 128

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"pos.scaling={self.method!r}: use one of {', '.join(METHODS)}")
        if self.factor < 1:
            raise ConfigError(f"pos.factor={self.factor} must be ≥ 1 (eval length ÷ training length)")
        if self.factor != 1 and self.method in ("none", "dynamic_ntk"):
            raise ConfigError(f"pos.factor={self.factor} is unused by pos.scaling={self.method} "
                              "(dynamic_ntk takes s from the length); set pos.factor=1 or another scaling")
        if (self.alpha, self.beta) != (1.0, 32.0) and self.method != "yarn":
            raise ConfigError("pos.alpha/pos.beta shape only YaRN's ramp; set pos.scaling=yarn or leave them")
        if not 0 <= self.alpha < self.beta:
            raise ConfigError(f"pos.alpha={self.alpha}, pos.beta={self.beta}: need 0 ≤ alpha < beta")
        if self.original_max_len <= 0:
            raise ConfigError(f"pos.original_max_len={self.original_max_len} must be positive")

    def frequencies(self, inv_freq: Tensor, length: int) -> ScaledFrequencies:
        """θ' for a sequence of ``length`` positions (only dynamic_ntk reads the length)."""
        return METHODS[self.method](self, inv_freq, length)
