"""FoX, the Forgetting Transformer (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate",
ICLR, §2): a data-dependent forget gate per head, f_t = σ(w_fᵀ x_t + b_f), down-weights the logits by
D_ij = Σ_{l=j+1..i} log f_l = F_i − F_j (F = cumsum log f); no other positions (NoPE otherwise).

Forgetting Attention is softmax(QKᵀ/√D + D) V with the causal mask: j ≤ i only, D_ii = 0, and the weight of
key j decays by every gate after it up to the query, so a head that keeps f ≈ 1 attends as NoPE does and one
with small f attends locally. x_t is the attention input of the layer, the tensor q, k and v are projected from
(after the pre-LN norm, as the paper's RMSNorm-then-attention block; the layer's input under post-LN).
One gate projection (w_f, b_f) per layer, H outputs; initialised as the paper's code does, w_f ~ N(0, 0.02)
and b_f = 0 (``init_std``, ``bias_init``): f starts near ½. log f and its cumulative sum are float32 at least
(F is a sum of T terms; the paper's code does the same).

Causal only: the paper defines D for j ≤ i (F_i − F_j for j > i would *raise* later keys by the gates between),
so a bidirectional task is refused; pos=dd_alibi (x-transformers' form) adds a second, backward gate for it.
The bias reads the layer input (``LogitBias.for_input``): a ``content`` bias, so local and kernelized attention
refuse it. No position index is read: positions cannot be randomized.

Notation: B batch, H heads, T length, C model width, G gate outputs per layer (H, or 2H with a backward gate).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.ranges import Float32, NonNegative, ranged
from positional.base import LogitBias, PositionalScheme, Shape, later_keys


def forget_bias(log_f: Tensor) -> Tensor:
    """D_ij = Σ_{l=j+1..i} log f_l = F_i − F_j with F_t = Σ_{l≤t} log f_l (Lin et al. 2025, §2), for every (i, j):
    the entries j > i are −D_ji, which the causal mask removes. log_f: (…, T) -> (…, T, T)."""
    return _Differences.apply(log_f.cumsum(-1))  # F: (…, T)


class _Differences(torch.autograd.Function):
    """F_i − F_j over all (i, j), whose gradient is ∂F_t = Σ_j ∂D_tj − Σ_i ∂D_it: two reductions of ∂D
    (B·H·T² entries per layer) instead of autograd's negated copy of it and the two reductions after."""

    @staticmethod
    def forward(ctx, cum: Tensor) -> Tensor:
        return cum[..., :, None] - cum[..., None, :]  # (…, T, T)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.sum(-1) - grad.sum(-2)  # (…, T)


def two_way_forget_bias(log_f: Tensor, log_g: Tensor) -> Tensor:
    """The bidirectional form of x-transformers' DataDependentAlibi: F_i − F_j for j ≤ i from the forward gates f,
    G_j − G_i = Σ_{l=i+1..j} log g_l for j > i from the backward gates g (keys after the query decay by the
    gates between them too). log_f, log_g: (…, T) -> (…, T, T)."""
    ahead = later_keys(log_f.shape[-1], log_f.shape[-1], log_f.device)  # j > i
    return torch.where(ahead, forget_bias(log_g).transpose(-1, -2), forget_bias(log_f))


def _log_gates(x: Tensor, gate: nn.Module, scale: float = 1.0) -> Tensor:
    """scale · log σ(W x_t + b) per gate output, x: (B, T, C) -> (B, G, T). The projection runs in the model's
    (autocast) dtype and log σ in float32 at least, as the paper's code does: the cumulative sum adds T of them."""
    logits = gate(x)  # (B, T, G)
    return F.logsigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).transpose(1, 2) * scale


class ForgetGateBias(LogitBias):
    """One layer's gates; the bias exists once the layer's input is known (``for_input``)."""

    kind = "content"

    def __init__(self, gate: nn.Module, causal: bool, scale: float = 1.0, log_f: Tensor | None = None):
        self.gate, self.causal, self.scale = gate, causal, scale
        self.log_f = log_f  # (B, G, T) once read from the input

    def for_input(self, x: Tensor) -> ForgetGateBias:
        return ForgetGateBias(self.gate, self.causal, self.scale, _log_gates(x, self.gate, self.scale))

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        """D for the input read by ``for_input``: (B, H, T, T), float32 at least."""
        if self.log_f is None:
            raise RuntimeError("a forget-gate bias reads the layer input: call for_input(x) first (the model does)")
        if self.causal:
            return forget_bias(self.log_f)
        return two_way_forget_bias(*self.log_f.chunk(2, dim=1))  # the forward, then the backward gates: (B, H, T) each


class ForgettingTransformer(PositionalScheme):
    bias_kind = "content"
    randomize_refusal = "FoX reads no position index: its decay is counted by its forget gates"
    bidirectional_refusal: ClassVar[str | None] = (
        "FoX's forget gates decay keys before the query only (Lin et al. 2025 define D for j ≤ i); pos=dd_alibi adds "
        "backward gates for keys after it"
    )

    @ranged
    def __init__(self, shape: Shape, init_std: NonNegative | None = 0.02, bias_init: Float32 = 0.0):
        super().__init__(shape)
        outputs = shape.n_heads * (1 if shape.causal else 2)  # bidirectional (dd_alibi): forward, then backward gates
        gates = [nn.Linear(shape.d_model, outputs) for _ in range(shape.n_layers)]  # (w_f, b_f) per layer
        for gate in gates:
            if init_std is not None:  # None: torch's default Linear init (as x-transformers leaves it)
                nn.init.normal_(gate.weight, std=init_std)
            nn.init.constant_(gate.bias, bias_init)
        self.gates = nn.ModuleList(gates)

    post_log_scale: float = 1.0  # a multiplier on log f: 1 in the paper (pos=dd_alibi takes it as an option)

    def logit_bias(self, positions: Tensor, layer: int) -> ForgetGateBias:
        return ForgetGateBias(self.gates[layer], self.shape.causal, self.post_log_scale)
