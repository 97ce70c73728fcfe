"""Logit-bias schemes through ``torch.nn.attention.flex_attention``: the bias as a ``score_mod``.

posbench's softmax variant adds a scheme's bias to the logits as a dense (1, H, T, T) additive mask, which
rules out the flash kernels (a mask means SDPA's memory-efficient kernel, which reads the whole bias).
FlexAttention instead calls a ``score_mod(score, b, h, q, kv)`` inside a fused kernel, so a bias that
depends on the offset i − j is a lookup into the scheme's own per-offset table (``RelativeBias.table``,
(H, Tq + Tk − 1): T5's buckets, ALiBi's slopes, KERPLE's kernel), and one that depends on i and j apart
(FIRE's MLP over normalised positions, a ``PositionalBias``) a lookup into its (H, T, T) values. The table is
built from the scheme's parameters inside the graph, so a learned bias gets its gradient through flex's
backward (captured tensors).

Checked on a GPU only (flex has no backward on a CPU, ../shared/FACTS.md): forward and gradient parity
with the dense path in fp32, and the attention step's time against plain SDPA without a bias
(``python -m harness.bench.gpu``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def _score_mod_of(bias, dtype: torch.dtype = torch.float32) -> ScoreMod:
    """The bias as a flex ``score_mod``: a lookup into the scheme's own table, nothing materialised T × T
    for a relative bias. ``dtype``: the table's, as the kernel adds it to its scores (fp32 in flex's kernels;
    ALiBi keeps its slopes in fp64)."""
    if bias.kind == "relative":  # positional.base.RelativeBias
        table, last = bias.table.to(dtype), bias.t_k - 1  # column o holds offset i − j = o − (Tk − 1)

        def relative(score, b, h, q, kv):
            return score + table[h, q - kv + last]

        return relative
    if bias.kind == "positional":  # positional.base.PositionalBias
        values = (bias.values[0] if bias.values.dim() == 4 else bias.values).to(dtype)  # (H, Tq, Tk)

        def positional(score, b, h, q, kv):
            return score + values[h, q, kv]

        return positional
    raise TypeError(f"{type(bias).__name__}: no flex score_mod for this kind of bias")


def causal(b, h, q, kv):
    return q >= kv


def dense_mask(bias, t: int, dtype: torch.dtype) -> Tensor:
    """What posbench's softmax variant hands SDPA for a causal model: the dense bias plus −inf above the diagonal."""
    mask = bias.dense().to(dtype)  # (1, H, T, T)
    return mask.masked_fill(torch.ones(t, t, dtype=torch.bool, device=mask.device).triu(1), float("-inf"))


@dataclass(frozen=True)
class Parity:
    out_err: float  # max |flex − dense| of the attention output
    grad_err: dict[str, float]  # max |flex − dense| of each gradient, relative to the dense one's max |·|
    note: str = ""


def parity(scheme, q: Tensor, k: Tensor, v: Tensor, flex_attention, create_block_mask) -> Parity:
    """One scheme's causal attention, dense (SDPA with the additive mask) vs flex (compiled), in the dtype of q:
    the output and the gradients of q, k, v and the scheme's parameters for one random upstream gradient."""
    t = q.shape[2]
    positions = scheme.positions(t, q.device)
    upstream = torch.randn_like(q)
    block = create_block_mask(causal, None, None, t, t, device=q.device)

    def run(path: str):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        scheme.zero_grad(set_to_none=True)
        bias = scheme.logit_bias(positions, 0)
        if path == "dense":
            out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=dense_mask(bias, t, q.dtype))
        else:
            out = flex_attention(qq, kk, vv, score_mod=_score_mod_of(bias, q.dtype), block_mask=block)
        (out * upstream).sum().backward()
        params = {f"pos.{n}": p.grad.clone() for n, p in scheme.named_parameters() if p.grad is not None}
        return out.detach(), {"q": qq.grad, "k": kk.grad, "v": vv.grad, **params}

    dense_out, dense_grads = run("dense")
    flex_out, flex_grads = run("flex")
    missing = sorted(set(dense_grads) - set(flex_grads))
    # a parameter that shifts a whole row of logits (FIRE's last bias) has a true gradient of 0 (softmax is
    # shift-invariant): both paths give rounding noise there, and a relative error of noise says nothing
    scale = max(float(g.abs().max()) for g in dense_grads.values())
    errs, zero = {}, []
    for n, g in dense_grads.items():
        if n in flex_grads and float(g.abs().max()) < 1e-6 * scale:
            zero.append(f"{n} ≈ 0 in both (max |Δ| {float((flex_grads[n] - g).abs().max()):.0e})")
        elif n in flex_grads:  # max |flex − dense| relative to the dense gradient's max |·|
            errs[n] = float((flex_grads[n] - g).abs().max() / g.abs().max().clamp_min(1e-30))
    notes = ([f"no flex gradient for {', '.join(missing)}"] if missing else []) + zero
    return Parity(float((flex_out - dense_out).abs().max()), errs, "; ".join(notes))


def attention_steps(
    scheme,
    batch: int,
    heads: int,
    t: int,
    head_dim: int,
    device: str,
    flex_attention,
    create_block_mask,
    dtype=torch.bfloat16,
) -> dict[str, Callable[[], None]]:
    """Forward + backward of one attention call, four ways, at (B, H, T, D) in ``dtype`` (causal):
    ``sdpa`` with no bias (the flash/cuDNN kernels), ``dense`` (posbench's path: SDPA with the additive mask,
    the bias gathered from the scheme's parameters), ``flex`` (the bias as a score_mod) and ``flex_plain``
    (flex with no bias: what the kernel itself costs against SDPA's)."""
    q, k, v = (torch.randn(batch, heads, t, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    positions = scheme.positions(t, device)
    block = create_block_mask(causal, None, None, t, t, device=device)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def dense():
        bias = scheme.logit_bias(positions, 0)
        F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(bias, t, dtype)).sum().backward()

    def flex():
        bias = scheme.logit_bias(positions, 0)
        flex_attention(q, k, v, score_mod=_score_mod_of(bias), block_mask=block).sum().backward()

    def flex_plain():
        flex_attention(q, k, v, block_mask=block).sum().backward()

    return {"sdpa": sdpa, "dense": dense, "flex": flex, "flex_plain": flex_plain}
