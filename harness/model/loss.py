"""Cross-entropy over the vocabulary a chunk of tokens at a time (``model.loss_chunk``).

``F.cross_entropy(F.linear(h, W, b), y)`` holds the (N, V) logits, their fp32 copy, the log-softmax and, in the
backward, its gradient: four (N, V) tensors, 16 bytes a token a vocabulary entry. With GPT-2's 50,257 ids and
0.5M tokens a step that is ~400 GiB; at 64k tokens a step, ~50 GiB, most of an 80 GB GPU. Here the forward
computes the logits of ``chunk`` tokens, reduces them to each token's loss and lets them go; the backward computes
them again, one chunk at a time, and turns each into its gradient at once:

    ∂loss/∂z = g · (softmax(z) − onehot(y))         (z: a token's logits, g: the incoming gradient)
    ∂loss/∂h = (∂loss/∂z) W,   ∂loss/∂W = Σ_tokens (∂loss/∂z)ᵀ h,   ∂loss/∂b = Σ_tokens ∂loss/∂z

so at most one chunk's (chunk, V) tensors exist, at the price of the decoder's matmul once more (2·N·C·V FLOPs:
~1/3 of the head's, a few percent of a step). The same idea as Liger Kernel's fused linear cross-entropy and
Wijmans et al. 2025, 'Cut Your Losses in Large-Vocabulary Language Models' (arXiv:2411.09009), written here in
plain torch ops.

Under autocast the logits are computed as autocast computes ``F.linear`` (in its dtype, e.g. bf16, from fp32
weights) and reduced in fp32, as ``F.cross_entropy(logits.float(), …)`` would; the gradients of ``h`` and ``W``
come back in their own dtypes.

``summed_loss`` is training's loss of a batch (harness/model/module.py) and the benchmarks' (this
module imports no lightning: a benchmark's measured start-up and memory stay its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.data.objectives import IGNORE

if TYPE_CHECKING:
    from harness.model.transformer import Transformer


def summed_cross_entropy(
    h: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, chunk: int, ignore_index: int
) -> Tensor:
    """Σ over scored tokens of −log softmax(h Wᵀ + b)[label]: h (N, C), weight (V, C), bias (V,) or None,
    labels (N,) with ``ignore_index`` where nothing is scored. Equal to ``F.cross_entropy(F.linear(h, weight,
    bias).float(), labels, ignore_index=ignore_index, reduction="sum")`` without the (N, V) logits."""
    device = h.device.type
    # the dtype autocast would give ``F.linear`` here (its own, when it is on), else h's
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
    return _ChunkedCrossEntropy.apply(h, weight, bias, labels, chunk, ignore_index, dtype)


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    with torch.autocast(h.device.type, enabled=False):
        z = F.linear(h.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return z.to(torch.promote_types(dtype, torch.float32))  # reduced in fp32 (fp64 kept)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk, ignore_index, dtype):
        total = h.new_zeros((), dtype=torch.promote_types(dtype, torch.float32))
        for start in range(0, len(h), chunk):
            z = _logits(h[start : start + chunk], weight, bias, dtype)
            total = total + F.cross_entropy(
                z, labels[start : start + chunk], ignore_index=ignore_index, reduction="sum"
            )
        ctx.save_for_backward(h, weight, bias, labels)
        ctx.chunk, ctx.ignore_index, ctx.dtype = chunk, ignore_index, dtype
        return total

    @staticmethod
    def backward(ctx, grad):
        h, weight, bias, labels = ctx.saved_tensors
        dtype = ctx.dtype
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
        db = None if bias is None else torch.zeros(bias.shape, dtype=dw.dtype, device=bias.device)
        for start in range(0, len(h), ctx.chunk):
            part, y = h[start : start + ctx.chunk], labels[start : start + ctx.chunk]
            dz = torch.softmax(_logits(part, weight, bias, dtype), dim=-1)  # (chunk, V), in place from here on
            scored = y != ctx.ignore_index
            dz[scored.nonzero(as_tuple=True)[0], y[scored]] -= 1
            dz *= scored.unsqueeze(1) * grad
            with torch.autocast(h.device.type, enabled=False):
                low = dz.to(dtype)
                if dh is not None:
                    dh[start : start + ctx.chunk] = (low @ weight.to(dtype)).to(h.dtype)
                dw += (low.T @ part.to(dtype)).to(dw.dtype)
                if db is not None:
                    db += dz.sum(0).to(db.dtype)
        return (
            dh,
            dw.to(weight.dtype) if ctx.needs_input_grad[1] else None,
            None if db is None or not ctx.needs_input_grad[2] else db.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def summed_loss(model: Transformer, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over the scored tokens, their count), training's loss and the benchmarks'; with
    ``model.loss_chunk`` set, from that many tokens' logits at a time (harness/model/loss.py), the whole batch's
    never held."""
    chunk = model.cfg.loss_chunk
    n = (batch["labels"] != IGNORE).sum()
    if chunk is None:
        out = model(batch["input_ids"], batch["key_padding_mask"], batch.get("document_ids"))  # (B, T, V)
        wide = out.flatten(0, 1).to(torch.promote_types(out.dtype, torch.float32))  # bf16 up, float64 kept
        return F.cross_entropy(wide, batch["labels"].flatten(), ignore_index=IGNORE, reduction="sum"), n
    h = model(batch["input_ids"], batch["key_padding_mask"], batch.get("document_ids"), decode=False)
    return summed_cross_entropy(h.flatten(0, 1), *model.output_layer(), batch["labels"].flatten(), chunk, IGNORE), n
