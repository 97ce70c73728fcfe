"""FIRE, functional interpolation for relative positions (Li et al. 2023, "Functional Interpolation for
Relative Positions Improves Long Context Transformers", §3, and the reference code in its appendix).

The logit bias of query i and key j ≤ i is a learned function of a normalised distance:

    b_ij = f_θ( ψ(i − j) / ψ(max(L, i)) ),     ψ(x) = log(c·x + 1),

f_θ an MLP 1 → 32 (ReLU) → H, one output per head. The input lies in [0, 1] for any length (i − j ≤ i ≤
max(L, i) and ψ increases), which is what lets FIRE extrapolate: longer inputs are interpolated into
the trained range ("progressive interpolation"). As the reference code: c = |c_0| with c_0 learned,
initialised 0.1; L = |m·L_0| with L_0 = 512 fixed and the multiplier m learned, initialised 1; ε = 1e-6
added to the denominator. One MLP (with its c and L) for all layers by default; ``per_layer: true``
gives each layer its own, as a module per attention layer in the reference code would.

Bidirectional (MLM), not in the paper (FIRE is defined for causal attention; its code, run without a
mask, would give keys after the query the same bias as keys before, and inputs > 1). Here:

    b_ij = f_θ( sign(i − j) · ψ(|i − j|) / ψ(max(L, N_i)) ),   N_i = max(i, T_last − i),

N_i the distance to the farther end of the input (T_last the last position), so the input stays in
[−1, 1] and keys before and after the query are told apart. Causal inputs are unchanged (N_i = i there
is the paper's normaliser, and the sign is +).

The bias depends on i − j *and* i (through the normaliser): not a Toeplitz matrix, so FIRE declares a
``positional`` bias, which kernelized and local attention refuse. The MLP runs on every (i, j) pair, as
in the reference code. (While every position is ≤ L one normaliser serves all rows and 2T − 1 offsets
would do, but telling so means comparing a position with the learned L on the host, which waits for the
GPU in every forward; the MLP's (T, T, W) is small beside the (B, H, T, T) logits it feeds.) Positions may
be randomized (the formula takes the positions themselves).

Notation: T positions, H heads, W MLP width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.errors import IncompatiblePairing
from harness.ranges import Positive, PositiveFloat32, PositiveInt, ranged
from positional.base import LogitBias, PositionalBias, PositionalScheme, Shape


def _fire_psi(x: Tensor, c: Tensor) -> Tensor:
    """ψ(x) = log(c·x + 1) (Li et al. 2023, §3), elementwise, x ≥ 0, c > 0."""
    return torch.log1p(c * x)


def fire_inputs(positions: Tensor, c: Tensor, threshold: Tensor, causal: bool, eps: float = 1e-6) -> Tensor:
    """The MLP's input per (i, j): sign(p_i − p_j)·ψ(|p_i − p_j|) / (ψ(max(L, N_i)) + ε). (T,) -> (T, T), or
    positions per row (B, T) -> (B, T, T) (causal only: the bidirectional N_i reads the last position).

    N_i = p_i (causal, the paper) or max(p_i, p_last − p_i) (bidirectional, see module doc). In fp32 at least, as
    c's dtype is bf16 in a model cast to bf16 (trainer.precision=bf16-true): bf16 spaces integers past 256 2 or more
    apart, so p_i − p_j would be 0 for neighbours at position 8192.
    """
    work = torch.promote_types(c.dtype, torch.float32)
    p, c, threshold = positions.to(work), c.to(work), threshold.to(work)
    reach = (p if causal else torch.maximum(p, p[-1] - p))[..., :, None]  # (T, 1) N_i
    offset = p[..., :, None] - p[..., None, :]  # (T, T) p_i − p_j
    return torch.sign(offset) * _fire_psi(offset.abs(), c) / (_fire_psi(torch.maximum(reach, threshold), c) + eps)


class Fire(PositionalScheme):
    init_L: Tensor  # () L_0, a buffer
    bias_kind = "positional"

    @ranged
    def __init__(
        self,
        shape: Shape,
        mlp_width: PositiveInt = 32,
        init_c: PositiveFloat32 = 0.1,
        init_L: PositiveFloat32 = 512.0,
        per_layer: bool = False,
        eps: Positive = 1e-6,
    ):
        super().__init__(shape)
        if shape.restart_positions and not shape.causal:
            raise IncompatiblePairing(
                "incompatible pairing: model.restart_positions=true with pos=fire on a "
                "bidirectional task: FIRE's N_i = max(p_i, p_last − p_i) reads the last position "
                "of the sequence, not of each document; use a causal task or "
                "model.restart_positions=false"
            )
        self.per_layer, self.eps = per_layer, eps
        self.bias_depends_on_layer = per_layer
        n = shape.n_layers if per_layer else 1
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, shape.n_heads)) for _ in range(n)
        )
        self.c = nn.Parameter(torch.full((n,), init_c))  # ψ's c per MLP, used as |c|
        self.register_buffer("init_L", torch.tensor(init_L))  # L_0, fixed
        self.L_multiplier = nn.Parameter(torch.ones(n))  # L = |m·L_0|, m learned

    def logit_bias(self, positions: Tensor, layer: int) -> LogitBias:
        at = layer if self.per_layer else 0
        c, threshold, mlp = self.c[at].abs(), (self.L_multiplier[at] * self.init_L).abs(), self.mlps[at]
        x = fire_inputs(positions, c, threshold, self.shape.causal, self.eps)  # (T, T) or (B, T, T), fp32 or wider
        # (…, T, T, H) in the first Linear's dtype, moved to (…, H, T, T)
        bias = mlp(x.unsqueeze(-1).to(next(mlp.parameters()).dtype)).movedim(-1, -3)
        return PositionalBias(bias if bias.dim() == 4 else bias.unsqueeze(0))  # (1 or B, H, T, T)

    @torch.no_grad()
    def diagnostics(self) -> dict[str, float]:
        return {"fire_c": float(self.c.abs().mean()), "fire_L": float((self.L_multiplier * self.init_L).abs().mean())}
