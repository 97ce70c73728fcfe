"""Transformer-XL relative encoding (Dai et al. 2019, ACL, §3.3, the A^rel_ij equation):

    A_ij = q_i·k_j + u·k_j + q_i·(W_R R_{i−j}) + v·(W_R R_{i−j})       terms (a) (c) (b) (d)
         = (q_i + u)·k_j + (q_i + v)·(W_R R_{i−j})

with R the fixed sinusoid (Vaswani et al. §3.5) of the offset i − j, W_R = W_{k,R} one per
layer, u, v ∈ R^{H×D} learned and shared across layers (as in the paper). Like the XL code we
scale the whole score by 1/√D. Softmax attention already computes q_i·k_j/√D from (unrotated)
q, k, so the bias returned here is the rest, **[u·k_j + (q_i + v)·W_R R_{i−j}] / √D**, and
softmax's logit q·k/√D + bias equals A_ij/√D exactly.

Offsets: bidirectional MLM uses i − j ∈ −(T−1) … T−1 (as XLNet does); causal LM only
0 … T−1, the future being masked (those entries are 0 here). The position term is computed
for each (i, offset) and moved to (i, j) by ``rel_shift`` (the XL paper's App. B trick).
b_ij depends on q_i, so the bias is ``content``, not a Toeplitz table.

Notation: B batch, H heads, T length, D head dim, C model width, O number of offsets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.ranges import NonNegative, ranged
from positional.base import LogitBias, PositionalScheme, Shape
from positional.sinusoidal import sinusoidal_table


def rel_shift(x: Tensor, t_k: int) -> Tensor:
    """Move scores from (query i, offset) to (query i, key j) without gathering (XL App. B).

    x: (..., Tq, O), column c holding offset i − j = Tq − 1 − c (descending), O ≤ Tq + Tk − 1.
    Returns (..., Tq, Tk) with out[i, j] = x[i, Tq − 1 − i + j]; 0 where that offset is absent.
    Row i starts Tq − 1 − i columns in, so reading the flat buffer of the zero-padded
    (Tq, Tq + Tk) scores from Tq − 1 with a row stride one less, Tq + Tk − 1, lands every row
    on its own start.
    """
    t_q, width = x.shape[-2], x.shape[-2] + t_k
    padded = F.pad(x, (0, width - x.shape[-1]))  # (..., Tq, Tq+Tk), absent offsets → 0
    flat = padded.flatten(-2)[..., t_q - 1 : t_q - 1 + t_q * (width - 1)]  # (..., Tq·(Tq+Tk−1))
    return flat.unflatten(-1, (t_q, width - 1))[..., :t_k]  # (..., Tq, Tk)


def xl_offsets(t: int, causal: bool, device=None) -> Tensor:
    """Offsets i − j in rel_shift's descending order: T−1 … −(T−1), or T−1 … 0 if causal."""
    return torch.arange(t - 1, -1 if causal else -t, -1, device=device)


class XLBias(LogitBias):
    kind = "content"

    def __init__(self, u: Tensor, v: Tensor, rel: Tensor):
        self.u, self.v = u, v  # (H, D) each
        self.rel = rel  # (H, O, D): W_R R_o for the offsets of xl_offsets

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        """[u·k_j + (q_i + v)·W_R R_{i−j}] / √D. q, k: (B, H, T, D) -> (B, H, T, T)."""
        content = torch.einsum("hd,bhjd->bhj", self.u.to(k.dtype), k)[:, :, None, :]  # (B, H, 1, Tk)
        raw = torch.einsum("bhid,hod->bhio", q + self.v.to(q.dtype)[:, None, :], self.rel.to(q.dtype))  # (B,H,Tq,O)
        return (content + rel_shift(raw, k.shape[-2])) * q.shape[-1] ** -0.5  # 1/√D, the scale softmax puts on q·k


class TransformerXL(PositionalScheme):
    bias_kind = "content"
    randomize_refusal = (
        "rel_shift moves scores over the offsets of consecutive positions, which sampled positions are not"
    )
    restart_refusal = (
        "rel_shift moves scores over the offsets of consecutive positions, which positions restarted "
        "per document are not (its scores read i − j only: with model.document_mask=true and no "
        "restart, every score it keeps is already the one inside the document)"
    )

    @ranged
    def __init__(self, shape: Shape, init_std: NonNegative = 0.02):
        super().__init__(shape)
        h, d, c = shape.n_heads, shape.head_dim, shape.d_model
        self.u = nn.Parameter(torch.randn(h, d) * init_std)  # (H, D), shared by all layers
        self.v = nn.Parameter(torch.randn(h, d) * init_std)  # (H, D), shared by all layers
        w_r = [nn.Linear(c, c, bias=False) for _ in range(shape.n_layers)]  # W_{k,R} per layer
        for w in w_r:
            nn.init.normal_(w.weight, std=init_std)
        self.w_r = nn.ModuleList(w_r)

    def logit_bias(self, positions: Tensor, layer: int) -> XLBias:
        offsets = xl_offsets(positions.numel(), self.shape.causal, positions.device)  # (O,)
        r = sinusoidal_table(offsets, self.shape.d_model).to(self.u.dtype)  # (O, C) R_{i−j}
        rel = self.w_r[layer](r).unflatten(-1, (self.shape.n_heads, -1)).transpose(0, 1)  # (H, O, D)
        return XLBias(self.u, self.v, rel)
