"""KERPLE, kernelized relative positional embedding (Chi et al. 2022, NeurIPS, §4, the two CPD kernels).

A logit bias from a conditionally positive definite kernel of the distance |m − n|, per head h:

    log    b_mn = −r1_h · log(1 + r2_h · |m − n|)      (``variant: log``)
    power  b_mn = −r1_h · |m − n|^r2_h,  0 < r2 ≤ 2    (``variant: power``)

with r1, r2 learned. Positivity as in the authors' code (their GPT-NeoX fork, ``ParallelKerpleLog`` /
``ParallelKerplePower``): a projection, not a reparametrisation. Once per forward, before any use, the
parameters are clamped in place to [ε, ∞), the power's exponent to [ε, 2], ε = 1e-2, so an optimizer
step that leaves the range is undone and the next gradient can still bring the parameter back (a clamp
inside the graph would leave it stuck with zero gradient). Initialisation as there: log r1 ~ U(0, 2),
r2 ~ U(0, 1); power r1 ~ U(0, 1), exponent r2 ~ U(0, 2). One set of parameters shared by all layers,
as the authors' code builds one module for the whole model (``per_layer: true`` gives one per layer).

Causal LM uses the distance to past keys (the future is masked); bidirectional MLM the symmetric
|m − n|, as for ALiBi. b depends on m − n only: a ``RelativeBias``, so kernelized attention applies
it as Toeplitz products (randomized positions make it a ``PositionalBias``, see positional/base.py).

Notation: H heads, O offsets.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from harness.ranges import ranged
from positional.base import LogitBias, PositionalScheme, Shape, bias_over_offsets

EPS = 1e-2  # the authors' lower bound on every KERPLE parameter
MAX_EXPONENT = 2.0  # the power kernel is conditionally positive definite for exponents in (0, 2]


def _kerple_log_bias(distance: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    """−r1_h · log(1 + r2_h · d) (Chi et al. 2022, §4, logarithmic variant). d: (O,) ≥ 0; r1, r2: (H,) -> (H, O)."""
    return -r1[:, None] * torch.log1p(r2[:, None] * distance[None, :])


def _kerple_power_bias(distance: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    """−r1_h · d^r2_h (Chi et al. 2022, §4, power variant). d: (O,) ≥ 0; r1, r2: (H,) -> (H, O)."""
    return -r1[:, None] * distance[None, :] ** r2[:, None]


KERNELS = {"log": _kerple_log_bias, "power": _kerple_power_bias}


class Kerple(PositionalScheme):
    bias_kind = "relative"

    @ranged
    def __init__(self, shape: Shape, variant: Literal["log", "power"] = "log", per_layer: bool = False):  # KERNELS
        super().__init__(shape)
        self.variant, self.per_layer = variant, per_layer
        self.bias_depends_on_layer = per_layer
        n, h = shape.n_layers if per_layer else 1, shape.n_heads
        # (L or 1, H) each; from the seeded global RNG, as every init
        self.r1 = nn.Parameter(torch.rand(n, h) * (2.0 if variant == "log" else 1.0))
        self.r2 = nn.Parameter(torch.rand(n, h) * (1.0 if variant == "log" else 2.0))

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the parameters into their ranges in place (the authors' projection, see module doc)."""
        self.r1.clamp_(min=EPS)
        self.r2.clamp_(min=EPS, max=MAX_EXPONENT if self.variant == "power" else None)

    def logit_biases(self, positions: Tensor, n_layers: int) -> list[LogitBias | None]:
        self.project()  # once, before any layer's graph holds the parameters (in place after would break backward)
        return super().logit_biases(positions, n_layers)

    def logit_bias(self, positions: Tensor, layer: int) -> LogitBias:
        # (2S−1,) |p_i − p_j|; S = T unless randomized. Causal: the future is masked, its entries unused
        distance = self.offsets(positions).abs().to(self.r1.dtype)
        at = layer if self.per_layer else 0
        return bias_over_offsets(
            KERNELS[self.variant](distance, self.r1[at], self.r2[at]), positions
        )  # table (H, 2S−1)

    @torch.no_grad()
    def diagnostics(self) -> dict[str, float]:
        return {"kerple_r1_mean": float(self.r1.mean()), "kerple_r2_mean": float(self.r2.mean())}
