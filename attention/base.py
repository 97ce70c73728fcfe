"""The attention-variant interface: one signature over (B, H, T, D) tensors.

Projections and head splitting live once, in the model; a variant only turns
q, k, v into outputs. The base class's ``forward`` applies the positions once: it checks
the pairing (a bias kind the variant does not accept, a widening rotary it cannot take:
an error, never dropped), folds the bias and the masks into one additive mask for a
variant that takes the dense logits (``dense_mask``), rotates q and k (unless the variant
rotates them itself, ``rotates_itself``: kernelized attention's RoFormer Eq. 19), and
hands the variant's ``attend`` a ``Positioned``. A variant writes only its kernel.

Each variant declares which logit-bias kinds it can honour; ``check_pairing``
refuses the others with a reason before training starts.

Notation: B batch, T sequence length, H heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from harness.errors import ConfigError, IncompatiblePairing
from positional.base import BiasKind, LogitBias, PositionalScheme, RelativeBias, Rotary, Shape, later_keys


@dataclass(frozen=True)
class AttentionContext:
    rotary: Rotary | None = None
    bias: LogitBias | None = None
    causal: bool = False
    key_padding_mask: Tensor | None = None  # (B, T) bool, True where the key is a real token
    document_ids: Tensor | None = None  # (B, T): with model.document_mask, query i sees key j only if they are equal


@dataclass(frozen=True)
class Positioned:
    """q and k with the positions applied (rotated, unless the variant rotates them itself: ``rotary``), the checked
    bias, and for a ``dense_mask`` variant the additive mask (bias, key padding, documents, causal; computed from the
    unrotated q, k, which a content bias reads). q, k: (B, H, T, D), or (B, H, T, W) for a widening rotary."""

    q: Tensor
    k: Tensor
    ctx: AttentionContext  # causal, key_padding_mask, document_ids as the model gave them
    mask: Tensor | None = None  # (B or 1, H or 1, Tq, Tk), −inf where masked; None: nothing to add
    rotary: Rotary | None = None  # the rotation a variant that ``rotates_itself`` applies

    def relative(self, variant: str) -> RelativeBias | None:
        """The bias as the per-offset table a Toeplitz variant reads (``table``, ``t_k``, ``far``), or None."""
        bias = self.ctx.bias
        if bias is not None and not isinstance(bias, RelativeBias):
            raise ConfigError(
                f"attn={variant} got a {bias.kind} logit bias that is no per-offset table; "
                "pair it with a scheme its refusal() allows"
            )
        return bias


class AttentionVariant(nn.Module):
    """Base class. Subclasses take ``shape: Shape`` first; other args come from conf/attn."""

    dense_mask: ClassVar[bool] = False  # the kernel takes the (Tq, Tk) additive mask (``Positioned.mask``)

    accepts_bias: frozenset[BiasKind] = frozenset()  # bias kinds this variant computes exactly
    # Why a bias kind is not accepted, for the refusal message (kind -> short reason).
    bias_refusals: ClassVar[dict[str, str]] = {}
    # Why q and k widened by the scheme's rotary (PositionalScheme.rotary_widens, PoPE's (B, H, T, 2D)) cannot be
    # applied; None for a variant whose forward takes q̃ᵀk̃ at whatever width it is handed, scaled by √(that width)
    wide_rotary_refusal: ClassVar[str | None] = (
        "it does not declare that it takes queries and keys wider than the head dim (wide_rotary_refusal = None)"
    )
    # Why attention across packed documents cannot be masked (model.document_mask=true); None: the forward folds
    # ``AttentionContext.document_ids`` into its mask (``additive_mask`` does)
    document_mask_refusal: ClassVar[str | None] = (
        "it does not declare that it masks attention across documents (document_mask_refusal = None)"
    )

    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape
        if shape.document_mask and self.document_mask_refusal:
            raise IncompatiblePairing(
                f"incompatible pairing: model.document_mask=true with attn={self.config_name()}: "
                f"{self.document_mask_refusal}; use attn=softmax or model.document_mask=false"
            )

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """q, k, v: (B, H, T, D) -> (B, H, T, D): the positions applied once, then the variant's kernel."""
        return self.attend(self.positioned(q, k, ctx, self.dense_mask), v)

    def attend(self, p: Positioned, v: Tensor) -> Tensor:
        """The variant's kernel: (B, H, T, D) outputs from the positioned q, k and v (B, H, T, D)."""
        raise NotImplementedError

    def rotates_itself(self) -> bool:
        """Whether ``attend`` applies the rotation itself (``Positioned.rotary``) instead of taking q, k rotated."""
        return False

    def positioned(self, q: Tensor, k: Tensor, ctx: AttentionContext, dense: bool) -> Positioned:
        """The pairing checked at forward time too (a bias or rotary the variant cannot apply is an error, never
        dropped), the mask folded (``dense``) from the unrotated q, k, then q and k rotated."""
        if ctx.bias is not None and ctx.bias.kind not in self.accepts_bias:
            raise ConfigError(
                f"attn={self.config_name()} got a {ctx.bias.kind} logit bias it cannot apply; "
                "pair it with a scheme its refusal() allows"
            )
        if ctx.rotary is not None and ctx.rotary.widens and self.wide_rotary_refusal:
            raise ConfigError(
                f"attn={self.config_name()} got queries and keys widened by the positional scheme: "
                f"{self.wide_rotary_refusal}; pair it with a scheme its refusal() allows"
            )
        mask = additive_mask(ctx, q, k) if dense else None
        itself = ctx.rotary is not None and self.rotates_itself()
        if ctx.rotary is not None and not itself:
            q, k = ctx.rotary.rotate_q(q), ctx.rotary.rotate_k(k)
        return Positioned(q, k, ctx, mask, ctx.rotary if itself else None)

    def before_training_step(self, step: int) -> None:
        """Called on the host before each training step's forward passes, with the optimizer steps taken so far
        (0, 1, …; the same for every micro-batch of an accumulated step): for state that moves with training,
        so that no forward reads a counter (Performer's feature redraw). Nothing by default."""

    def diagnostics(self) -> dict[str, float]:
        """Scalars logged as ``attn/<key>`` (from layer 0) at every training log step."""
        return {}

    def keys_attended(self, t: int, ctx: AttentionContext, device=None) -> Tensor:
        """n_i, how many keys query i attends (length-scaled temperature reads it, harness/model/temperature.py):
        (T,), or (B, 1, T) where padding makes it differ by row. All keys up to and including i under a causal
        mask, every unpadded key without one; a variant that attends fewer (a window) counts its own."""
        return count_keys(t, ctx, (t, t), device)

    def implied_weights(self, q: Tensor, k: Tensor, ctx: AttentionContext) -> Tensor:
        """The weights w (B, H, Tq, Tk) this variant applies to v: ``forward(q, k, v, ctx) = w @ v`` in eval
        mode, formed explicitly (T×T) for attention diagnostics on short samples (harness/model/diagnostics.py).
        A query that sees no key has a zero row. q, k: (B, H, T, D)."""
        return self.weights(self.positioned(q, k, ctx, dense=True))

    def weights(self, p: Positioned) -> Tensor:
        """``implied_weights`` from the positioned q, k (``p.mask`` folded whatever ``dense_mask`` says)."""
        raise NotImplementedError(
            f"attn={self.config_name()} does not implement weights(p) (implied_weights), so "
            "its attention cannot be drawn; implement it, or set diagnostics=false"
        )

    @classmethod
    def implies_weights(cls) -> bool:
        """Whether the variant says which weights it applies (``weights``): diagnostics=true needs it."""
        return cls.weights is not AttentionVariant.weights

    @classmethod
    def refusal(cls, scheme: type[PositionalScheme] | PositionalScheme) -> str | None:
        """Why this variant cannot honour ``scheme``, or None if it can. A built scheme may declare
        another bias kind than its class (pos.randomize=true turns a relative bias positional)."""
        if scheme.bias_kind != "none" and scheme.bias_kind not in cls.accepts_bias:
            why = cls.bias_refusals.get(scheme.bias_kind)
            return (
                f"attn={cls.config_name()} cannot apply a {scheme.bias_kind} logit bias "
                f"(pos={scheme.config_name()}){f': {why}' if why else ''}; choose another attn or pos"
            )
        if scheme.rotary_widens and cls.wide_rotary_refusal:
            return (
                f"attn={cls.config_name()} cannot apply queries and keys widened by pos={scheme.config_name()}: "
                f"{cls.wide_rotary_refusal}; choose another attn or pos"
            )
        return None

    @classmethod
    def config_name(cls) -> str:
        """conf/attn/<name>.yaml pairs with attention/<name>.py."""
        return cls.__module__.rsplit(".", 1)[-1]


def check_pairing(scheme: type[PositionalScheme] | PositionalScheme, variant: type[AttentionVariant]) -> None:
    reason = variant.refusal(scheme)
    if reason:
        raise IncompatiblePairing(f"incompatible pairing: {reason}")


def additive_mask(ctx: AttentionContext, q: Tensor, k: Tensor) -> Tensor | None:
    """The logit bias, key padding and causal mask folded into one additive float mask.

    Returns None when there is nothing to add (so a fused kernel can use is_causal).
    Shape broadcastable to (B, H, Tq, Tk); masked entries are -inf.
    """
    if ctx.bias is None and ctx.key_padding_mask is None and ctx.document_ids is None:
        return None
    t_q, t_k = q.shape[-2], k.shape[-2]
    mask = q.new_zeros(1, 1, t_q, t_k) if ctx.bias is None else ctx.bias.dense(q, k).to(q.dtype)
    if ctx.key_padding_mask is not None:
        mask = mask.masked_fill(~ctx.key_padding_mask[:, None, None, :], float("-inf"))  # padded keys: (B, 1, 1, Tk)
    if ctx.document_ids is not None:  # no attention across packed documents (model.document_mask)
        other = ctx.document_ids[:, None, :, None] != ctx.document_ids[:, None, None, :]  # (B, 1, Tq, Tk)
        mask = mask.masked_fill(other, float("-inf"))
    if ctx.causal:
        mask = mask.masked_fill(later_keys(t_q, t_k, q.device), float("-inf"))
    return mask


def count_keys(t: int, ctx: AttentionContext, band: tuple[int, int], device=None) -> Tensor:
    """n_i for query i seeing keys j with −right ≤ i − j ≤ left (``band`` = (left, right); right is 0 under a
    causal mask): (T,), or (B, 1, T) counting only unpadded keys when there is a padding mask and no causal one
    (a causal model's padding follows its real tokens, so a real query's prefix holds no padded key)."""
    left, right = band[0], 0 if ctx.causal else band[1]
    i = torch.arange(t, device=device)
    real = None if ctx.causal else ctx.key_padding_mask  # (B, T): causal padding follows the real tokens
    if ctx.document_ids is None and real is None:
        return i.clamp(max=left) + (t - 1 - i).clamp(max=right) + 1
    seen = ((i[:, None] - i[None, :]) <= left) & ((i[None, :] - i[:, None]) <= right)  # (T, T)
    if ctx.document_ids is not None:  # keys of the query's own document only (model.document_mask)
        seen = seen & (ctx.document_ids[:, :, None] == ctx.document_ids[:, None, :])  # (B, T, T)
    if real is not None:
        seen = seen & real[:, None, :]  # (B, T, T)
    return seen.sum(-1).clamp(min=1)[:, None, :]  # (B, 1, T)
