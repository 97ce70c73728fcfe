"""CoPE, contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding: Learning to
Count What's Important", §3, and the code of its Appendix B).

Positions are counted by the content: for query i and key j ≤ i,

    g_ij = σ(q_i·k_j / √D)      gates (of the scaled logits, as the Appendix B code),
    p_ij = Σ_{t=j..i} g_it      how many "counted" keys lie between j and i, capped at npos − 1,
    z_ij = w·q_i·e[⌈p_ij⌉] + (1 − w)·q_i·e[⌊p_ij⌋],  w = p_ij − ⌊p_ij⌋   (q_i·e[p_ij], interpolated),

and z_ij is added to the logit q_i·k_j/√D (unscaled, as in the paper's code). e ∈ R^{npos×D} is learned
per layer, shared by the heads, initialised to zeros (Appendix B); its gradient flows through w into
the gates as well. No position index is read: positions cannot be randomized.

Bidirectional (MLM), not in the paper (CoPE is defined causal): keys after the query are counted the
same way towards them, p_ij = Σ_{t=i..j} g_it for j > i, and read from a second table e' (so that
before and after are told apart). Causal inputs never use e'.

Padding needs no special case: for a real query i and a real key j every t between them is real (pads
sit only at the ends), so padded keys never enter a count that matters (they cancel out of the running
sums ``cope_positions`` takes differences of, up to round-off).

z depends on q and k: a ``content`` bias. Local and kernelized attention refuse it (neither forms the
logits q_i·k_j the gates are made of).

Notation: B batch, H heads, T length, D head dim, P = npos (2·npos with the bidirectional table).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from harness.ranges import NonNegative, Range, ranged
from positional.base import LogitBias, PositionalScheme, Shape, later_keys


def cope_positions(gates: Tensor, causal: bool) -> Tensor:
    """p_ij = Σ_{t=j..i} g_it for j ≤ i; for j > i Σ_{t=i..j} g_it, or (causal) any value, masked later.

    One running sum C_ij = Σ_{t ≤ j} g_it gives both: Σ_{t=j..i} g_it = C_ii − C_ij + g_ij and
    Σ_{t=i..j} g_it = C_ij − C_ii + g_ii, without flips or masks (profiled: the reversed cumulative
    sum's two flips were the largest cost of a CoPE step). Round-off: ~T·eps absolute. (…, T, T) -> same.
    """
    c = gates.cumsum(-1)  # (…, T, T)
    c_ii = c.diagonal(dim1=-2, dim2=-1)[..., None]  # (…, T, 1)
    before = c_ii - c + gates
    if causal:
        return before
    g_ii = gates.diagonal(dim1=-2, dim2=-1)[..., None]  # (…, T, 1)
    return torch.where(later_keys(gates.shape[-2], gates.shape[-1], gates.device), c - c_ii + g_ii, before)


def cope_interpolate(q_e: Tensor, pos: Tensor) -> Tensor:
    """q·e[p] interpolated between ⌊p⌋ and ⌈p⌉ (Golovneva et al. 2024, §3): q_e[n] + w·(q_e[n+1] − q_e[n]),
    n = ⌊p⌋, w = p − n. q_e: (…, T, P) the products q_i·e[n]; pos: (…, T, T) in [0, P − 1]. -> (…, T, T).

    One index for both gathers. The step at n = P − 1 (and, bidirectional, at the last entry of e) is never
    weighted: p reaches it only capped, where w = 0 and the cap passes no gradient.
    """
    low = pos.floor()
    n = low.long()
    step = torch.diff(q_e, dim=-1, append=q_e[..., -1:])  # (…, T, P): q_e[n+1] − q_e[n], 0 at the end
    return q_e.gather(-1, n) + (pos - low) * step.gather(-1, n)  # the gradient reaches the gates through w


class CoPEBias(LogitBias):
    kind = "content"

    def __init__(self, table: Tensor, npos: int, causal: bool):
        self.table = table  # (P, D): e, then e' when bidirectional
        self.npos, self.causal = npos, causal

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        """z_ij for q, k: (B, H, T, D) -> (B, H, T, T), in float32 at least (counts of T gates in bf16 drift)."""
        work = torch.promote_types(q.dtype, torch.float32)
        logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # (B, H, T, T), q_i·k_j/√D
        pos = cope_positions(torch.sigmoid(logits.to(work)), self.causal).clamp(0, self.npos - 1)
        if not self.causal:  # keys after the query index e': columns npos … 2·npos − 1
            pos = pos + later_keys(pos.shape[-2], pos.shape[-1], pos.device) * self.npos
        return cope_interpolate(q.to(work) @ self.table.to(work).T, pos)  # q·e[n]: (B, H, T, P)


class CoPE(PositionalScheme):
    bias_kind = "content"
    randomize_refusal = "CoPE counts positions from its gates and reads no position index"

    @ranged
    def __init__(
        self,
        shape: Shape,
        npos: Annotated[int, Range("an integer ≥ 2 (positions are capped at npos − 1)", ge=2)] = 16,
        init_std: NonNegative = 0.0,
    ):
        super().__init__(shape)
        self.npos = npos
        tables = 1 if shape.causal else 2  # e, and e' for keys after the query (bidirectional)
        self.emb = nn.Parameter(torch.randn(shape.n_layers, tables * npos, shape.head_dim) * init_std)  # (L, P, D)

    def logit_bias(self, positions: Tensor, layer: int) -> CoPEBias:
        return CoPEBias(self.emb[layer], self.npos, self.shape.causal)
