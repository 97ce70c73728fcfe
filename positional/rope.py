"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864).

Each pair of a head's query/key dims at position m is rotated by the angle m·θ_i with
θ_i = base^(−2i/R), i = 0 … R/2−1 (Eq. 15, 0-indexed). The block-diagonal rotation R^d_{Θ,m}
of Eq. 13 is applied in its elementwise form (Eq. 34), so ⟨R_m q, R_n k⟩ depends on m − n
only (Eq. 16). Options:
  layout    interleaved  pairs (x_{2i}, x_{2i+1}), the paper's Eq. 13
            half         pairs (x_i, x_{i+R/2}), GPT-NeoX; the same map up to a fixed permutation
  fraction  partial rotary (GPT-J / GPT-NeoX rotary_pct): only the first R = fraction·D dims
            turn, with θ over R; the other D − R dims pass through
  scaling   eval-time length scaling (positional/rope_scaling.py; conf/pos/scaling/<method>.yaml, picked with
            pos/scaling=<method>); training uses plain angles. ``eval.scalings`` also takes Self-Extend and Dual
            Chunk Attention, which remap positions per query-key pair (positional/rope_remapped.py).
  resonance Resonance RoPE (Wang et al. 2024, arXiv:2403.00071, Alg. 1): every wavelength λ_i = 2π/θ_i rounded
            to the nearest integer, θ̃_i = 2π/round(λ_i), so each pair's angle repeats exactly every λ̃_i
            positions and a position beyond the training length shows no angle training did not (for pairs with
            λ̃_i ≤ L) — ``rope_frequencies``.
  hope      HoPE (Chen et al. 2024, arXiv:2410.21216, §4): only the high frequencies stay, those completing at
            least one full period within the training length L (2π/θ_i ≤ L); the others become position-
            independent, θ_i = 0 (their pairs are not rotated) — ``rope_frequencies``. L is data.seq_len, or
            max_position under pos.randomize=true. Only this rule is applied: no band of the highest
            frequencies is removed. With both options, HoPE selects and the kept θ are rounded.
  rotate_heads  rotate the last k of the H heads only; the first H − k see no position (x-transformers'
            ``rotate_num_heads``, the decoupled RoPE heads of DeepSeek-V2's multi-head latent attention). null: all.
The two fix θ before training; an eval-time ``scaling`` rescales the θ they give.

``Rotation.at_width(w)`` is "the same scheme for a vector of width w" (kernelized attention
rotates φ(q), φ(k), RoFormer Eq. 19): same layout, base, scaling, and fraction, rotating the
first 2⌊fraction·w/2⌋ dims with θ_i = base^(−2i/R_w) over that rotated width R_w.

Notation: T positions, D head dim, R rotated width, W width of the rotated vector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Annotated, ClassVar, Literal

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.ranges import Range, ranged
from positional.base import LogitBias, PositionalScheme, Rotary, Shape
from positional.rope_remapped import REMAPS, DualChunk, Remap, RemappedLogits, SelfExtend
from positional.rope_scaling import METHODS, RopeScaling, ScaledFrequencies, as_field_of, scaling_for


def rope_inv_freq(head_dim: int, base: float, dtype=torch.float32, device=None) -> Tensor:
    """θ_i = base^(−2i/D) for i = 0 … D/2−1 (RoFormer Eq. 15). Shape (D/2,)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=dtype, device=device) / head_dim)


def rope_frequencies(
    rotated: int, base: float, hope: int | None = None, resonance: bool = False, dtype=torch.float64, device=None
) -> Tensor:
    """pos=rope's θ over a rotated width R: θ_i = base^(−2i/R), then HoPE's selection at the training length ``hope``
    (None: no HoPE), then Resonance's rounding where set (module doc); with neither, exactly ``rope_inv_freq``.
    posbench's models (``Rope.frequencies_at``) and pretrained ones (harness/pretrained/rotary.py) both take θ from
    here. Shape (R/2,)."""
    theta = rope_inv_freq(rotated, base, dtype, device)
    if hope:
        # θ_i where 2π/θ_i ≤ L (the pair turns at least once within the training length L), 0 elsewhere: HoPE's
        # high-frequency components, the rest made position-independent (Chen et al. 2024, §4)
        theta = torch.where(2 * math.pi / theta <= hope, theta, 0.0)
    if resonance:
        # θ̃_i = 2π / round(2π/θ_i): each wavelength rounded to a whole number of positions (Resonance RoPE, Wang et
        # al. 2024, Alg. 1). A θ_i = 0 (no rotation, HoPE's) stays 0
        wavelength = torch.round(2 * math.pi / theta)  # θ = 0: an infinite wavelength, and 2π/∞ = 0 again
        theta = torch.where(theta > 0, 2 * math.pi / wavelength, theta)
    return theta


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """m·θ_i for every position m and frequency i. Shape (T, D/2); positions per row (B, T) give (B, 1, T, D/2),
    one rotation per row that broadcasts over the heads of (B, H, T, D)."""
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (..., T, D/2)
    return angles if positions.dim() == 1 else angles.unsqueeze(-3)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x_{2i}, x_{2i+1}) of x's last dim (RoFormer Eq. 34).

    Written as the complex product (x_{2i} + i·x_{2i+1})·(cos + i·sin) of RoFormer Eq. 12: one
    elementwise pass each way instead of four products, a sum, a difference and a stack (the real form
    made RoPE several times costlier). Same arithmetic, so same rounding.
    Dtypes without a complex counterpart here (bf16, fp16) take the real form, written into one output.
    x: (..., T, R); cos, sin: (T, R/2). Returns (..., T, R).
    """
    return _rotate(x, cos, sin, _turn_pairs)


def apply_rope_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+R/2}) (GPT-NeoX layout): apply_rope conjugated by the permutation
    that interleaves the two halves. x: (..., T, R); cos, sin: (T, R/2). Returns (..., T, R)."""
    return _rotate(x, cos, sin, _turn_halves)


_COMPLEX = (torch.float32, torch.float64)


def _turn_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The interleaved rotation, no autograd: (..., T, R) -> (..., T, R)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's strides: the
    # q/k views of a fused projection come out in (B, H, T, D) order, so the next matmul needs no copy
    if x.dtype in _COMPLEX:
        # (..., T, R/2) complex, a view whenever the strides allow (a q/k view of a fused qkv projection does), else
        # a copy: view_as_complex needs unit stride within a pair and even strides/offset elsewhere
        viewable = x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])
        pairs = torch.view_as_complex((x if viewable else x.contiguous()).unflatten(-1, (-1, 2)))
        torch.mul(pairs, torch.complex(cos, sin), out=torch.view_as_complex(out.unflatten(-1, (-1, 2))))
        return out
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, R/2) each, strided views
    torch.mul(even, cos, out=out[..., 0::2]).addcmul_(odd, sin, value=-1)  # x_2i cos − x_2i+1 sin
    torch.mul(odd, cos, out=out[..., 1::2]).addcmul_(even, sin)  # x_2i+1 cos + x_2i sin
    return out


def _turn_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The half-layout rotation, no autograd, written into one output (no cat): (..., T, R) -> (..., T, R)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., T, R/2) each
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out.chunk(2, dim=-1)
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
    return out


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, turn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> Tensor:
    # trainable θ: autograd differentiates the angles too; under torch.compile (model.compile=true): plain
    # ops, which inductor fuses, since dynamo cannot trace the eager kernels' out= views and complex views
    if not (cos.requires_grad or sin.requires_grad or torch.compiler.is_compiling()):
        return _Rotate.apply(x, cos, sin, turn)
    # the same maps in plain autograd-visible ops
    if turn is _turn_halves:
        x1, x2 = x.chunk(2, dim=-1)  # (..., T, R/2) each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, R/2) each
    return torch.stack((x_even * cos - x_odd * sin, x_odd * cos + x_even * sin), dim=-1).flatten(-2)


class _Rotate(torch.autograd.Function):
    """y = R_θ x with fixed angles. A rotation's adjoint is the rotation by −θ, so backward is the same
    one pass with sin negated, reading the incoming gradient where it lies (autograd's
    view_as_real backward copies every q/k gradient to contiguous memory first)."""

    @staticmethod
    def forward(ctx, x, cos, sin, turn):
        ctx.save_for_backward(cos, sin)
        ctx.turn = turn
        return turn(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return ctx.turn(grad, cos, -sin), None, None, None


LAYOUTS = {"interleaved": apply_rope, "half": apply_rope_half}
Layout = Literal["interleaved", "half"]  # LAYOUTS' names
Base = Annotated[float, Range("a positive finite number (θ_i = base^(−2i/R))", gt=0)]  # RoPE's and its kin's


def rotated_width(width: int, fraction: float) -> int:
    """The even number of leading dims partial rotary turns: 2⌊fraction·width/2⌋."""
    return 2 * math.floor(fraction * width / 2 + 1e-9)


@dataclass(frozen=True)
class Rotation(Rotary):
    cos: Tensor  # (T, R/2), times the attention scale
    sin: Tensor  # (T, R/2), times the attention scale
    at_width: Callable[[int], Rotation]  # the same scheme for a vector of width w (see module doc)
    apply: Callable[[Tensor, Tensor, Tensor], Tensor] = apply_rope
    scale: float = 1.0  # on the pass-through dims: YaRN paper's √(1/t) (all of q·k ÷ t), 1 in HF's convention
    heads: int | None = None  # rotate the last ``heads`` heads of a (B, H, T, W) input only; None: every head
    # cos, sin cast to a dtype once per forward, not once per layer and per q and k (dtype -> (cos, sin))
    _cast: dict = field(default_factory=dict, repr=False, compare=False)

    def rotate(self, x: Tensor) -> Tensor:
        """x: (..., T, W) with W ≥ R; the first R dims turn, the rest are only scaled. With ``heads``, x is
        (B, H, T, W) and its first H − heads heads pass through unchanged."""
        if self.heads is not None and self.heads < x.shape[-3]:
            kept = x.shape[-3] - self.heads
            return torch.cat((x[..., :kept, :, :], self._turn(x[..., kept:, :, :])), dim=-3)  # (B, H, T, W)
        return self._turn(x)

    def _turn(self, x: Tensor) -> Tensor:
        r = 2 * self.cos.shape[-1]
        if x.dtype not in self._cast:
            self._cast[x.dtype] = (self.cos.to(x.dtype), self.sin.to(x.dtype))
        turned = self.apply(x[..., :r], *self._cast[x.dtype])  # (..., T, R)
        if r == x.shape[-1]:
            return turned
        rest = x[..., r:] if self.scale == 1.0 else x[..., r:] * self.scale
        return torch.cat((turned, rest), dim=-1)  # (..., T, W)


class Rope(PositionalScheme):
    inv_freq: Tensor  # (R/2,) θ, a buffer (a Parameter in pos=rope_trainable)
    length_scalings = (*METHODS, *REMAPS)

    @ranged
    def __init__(
        self,
        shape: Shape,
        base: Base = 10000.0,
        layout: Layout = "interleaved",
        fraction: float = 1.0,
        scaling: RopeScaling | Callable[..., RopeScaling] | None = None,
        resonance: bool = False,
        hope: bool = False,
        rotate_heads: int | None = None,
    ):
        """``scaling``: the eval-time length scaling, ``RopeScaling("yarn", factor=4.0)``, or a callable that builds
        one from ``base=`` and ``rotated=`` (conf/pos/scaling/<method>.yaml, a partial RopeScaling); either way
        its ``base`` and ``rotated`` are this θ's, and its ``original_max_len`` defaults to ``shape.max_len``.
        None: no scaling.
        ``resonance``, ``hope``: Resonance RoPE's and HoPE's θ (module doc).
        ``rotate_heads``: rotate the last k heads only (None: every head).
        Randomized positions wrap any scheme: positional/randomized.py."""
        super().__init__(shape)
        d, r = shape.head_dim, rotated_width(shape.head_dim, fraction)
        if not 0 < fraction <= 1 or r == 0 or abs(r - fraction * d) > 1e-9:
            raise ConfigError(
                f"pos={self.config_name()} rotates pairs of dims but fraction × head dim = "
                f"{fraction} × {d} is not a positive even integer; make the head dim d_model / n_heads "
                "(model.d_model / model.n_heads) even or pick a fraction that gives one"
            )
        if rotate_heads is not None and not (isinstance(rotate_heads, int) and 1 <= rotate_heads <= shape.n_heads):
            raise ConfigError(
                f"rotate_heads={rotate_heads} must be a whole number of heads in 1 … model.n_heads="
                f"{shape.n_heads} (null: rotate every head)"
            )
        self.base, self.layout, self.fraction, self.rotated = base, layout, fraction, r
        self.resonance, self.hope, self.rotate_heads = resonance, hope, rotate_heads
        if hope and not self.frequencies_at(r, device="cpu").any():  # on the host: a check builds on meta
            raise ConfigError(
                f"hope=true keeps the frequencies that turn at least once within the training length "
                f"{self.position_range}, and none does (the fastest turns once in 2π ≈ 6.3 positions); "
                "train on longer sequences or set hope=false"
            )
        self.scaling = _complete(scaling or RopeScaling, base, r, shape.max_len)
        self._register_theta(self.frequencies_at(r))
        self.scale_in_training = False  # True only inside ``rescaled(..., in_training=True)``: a fine-tune
        self.remap: Remap | None = None  # Self-Extend or DCA, inside ``rescaled``

    @contextmanager
    def rescaled(self, method: str, length: int, in_training: bool = False) -> Iterator[RopeScaling]:
        """Apply scaling ``method`` (at training time too if ``in_training``) for inputs of ``length``, then
        restore the configured one: one trained model, scored under every scaling. s = the configured scaling's
        factor where that is set (≠ 1), else max(1, length / original_max_len)."""
        own = self.scaling
        if method in REMAPS:  # the configured θ, its positions remapped per pair (sizes from the trained length)
            trained = own.training_length
            self.remap = SelfExtend.fitting(length, trained) if method == "self_extend" else DualChunk.fitting(trained)
        else:
            s = own.factor if own.factor != 1 else max(1.0, length / own.training_length)
            self.scaling, self.scale_in_training = scaling_for(own, method, s), in_training
        try:
            yield self.scaling
        finally:
            self.scaling, self.scale_in_training, self.remap = own, False, None

    def _register_theta(self, theta0: Tensor) -> None:
        # float64 so angles m·θ stay accurate at long evaluation lengths; rotate() casts cos, sin
        self.register_buffer("inv_freq", theta0, persistent=False)

    def frequencies_at(self, rotated: int, dtype=torch.float64, device=None) -> Tensor:
        """``rope_frequencies`` over a rotated width R with this scheme's base, HoPE (at its training length) and
        Resonance."""
        hope = self.position_range if self.hope else None
        return rope_frequencies(rotated, self.base, hope, self.resonance, dtype, device)

    float64_state: ClassVar[tuple[str, ...]] = ("inv_freq",)  # θ: kept in float64 whatever dtype the model is cast to

    def theta_at(self, rotated: int) -> Tensor:
        """θ for a rotated width: the scheme's own θ at its width, ``frequencies_at`` that width otherwise."""
        if rotated == self.rotated:
            return self.inv_freq
        return self.frequencies_at(rotated, self.inv_freq.dtype, self.inv_freq.device)

    def positions(self, t: int, device=None) -> Tensor:
        """0 … T−1 as one tensor per (T, device), handed to every forward: ``_cos_sin`` recognises it by identity
        and reuses its cos, sin without reading a position (a comparison of values would wait for the GPU)."""
        if self.sampling or torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return super().positions(t, device)  # an inference tensor, kept, could not be saved for a backward
        device = torch.device("cpu" if device is None else device)
        own = self.__dict__.get("_positions")
        if own is None or own.numel() != t or own.device != device or own._version:
            own = self.__dict__["_positions"] = super().positions(t, device)  # not state: no buffer, no checkpoint
        return own

    def rotary(self, positions: Tensor) -> Rotation:
        return self._rotation(positions, self.shape.head_dim)  # once per forward, shared by all layers

    def logit_biases(self, positions: Tensor, n_layers: int) -> list[LogitBias | None]:
        """None, or under ``rescaled`` Self-Extend's or DCA's remapped logits (positional/rope_remapped.py)."""
        if self.remap is None:
            return super().logit_biases(positions, n_layers)
        return [
            RemappedLogits(self.remap, positions, lambda x, at: self._rotation(at, x.shape[-1]).rotate(x))
        ] * n_layers

    def _rotation(self, positions: Tensor, width: int) -> Rotation:
        theta = self.theta_at(rotated_width(width, self.fraction))
        # length scaling changes evaluation only (and a fine-tune under ``rescaled``); training sees plain angles
        if self.training and not self.scale_in_training:
            f = ScaledFrequencies(theta, 1.0)
        else:  # at T = the largest position + 1, which dynamic_ntk and longrope read: the count of positions
            # 0 … T−1 (restarted per document: T too), so no value is read, except for a sorted sample
            # (pos.randomize=true): a fine-tune under ``rescaled``, or evaluation at pos.eval_positions=sampled
            f = self.scaling.frequencies(theta, int(positions[-1]) + 1 if self.sampling else positions.shape[-1])
        cos, sin = self._cos_sin(positions, f.inv_freq, f.attention_scale)  # (T, R/2) each
        return Rotation(
            cos,
            sin,
            apply=LAYOUTS[self.layout],
            scale=f.pass_through_scale,
            heads=self.rotate_heads,
            at_width=lambda w: self._rotation(positions, w),
        )

    def _cos_sin(self, positions: Tensor, inv_freq: Tensor, s: float) -> tuple[Tensor, Tensor]:
        """s·cos, s·sin of m·θ, built once per length and reused by later forwards while the positions are this
        scheme's own (``positions``) and its fixed θ is unchanged (float64 cos and sin are a real share of
        RoPE's time). Other positions, learned or rescaled θ, and a compiled forward (whose
        graph holds the computation) compute them afresh."""
        fresh = (
            inv_freq is not self.inv_freq
            or inv_freq.requires_grad
            or torch.compiler.is_compiling()
            or positions is not self.__dict__.get("_positions")
        )
        if fresh:
            angles = rope_angles(positions, inv_freq)  # (T, R/2)
            return angles.cos() * s, angles.sin() * s
        key = (
            positions.numel(),
            positions.device,
            positions._version,
            inv_freq.dtype,
            inv_freq.data_ptr(),
            inv_freq._version,
            s,
        )
        hit = self.__dict__.get("_trig", {}).get(key)
        if hit is None or hit[0] is not positions:
            angles = rope_angles(positions, inv_freq)
            hit = (positions, angles.cos() * s, angles.sin() * s)
            self.__dict__["_trig"] = {key: hit}  # one length at a time; not state (no buffer, no checkpoint)
        return hit[1], hit[2]


def _complete(
    scaling: RopeScaling | Callable[..., RopeScaling], base: float, rotated: int, max_len: int
) -> RopeScaling:
    """The scaling for this θ (base, rotated width), over the training length unless it names its own; its errors
    worded as fields of Rope's ``scaling`` argument (``scaling.factor=0 …``)."""
    try:
        built = (
            replace(scaling, base=base, rotated=rotated)
            if isinstance(scaling, RopeScaling)
            else scaling(base=base, rotated=rotated)
        )
        return built if built.original_max_len is not None else replace(built, original_max_len=max_len)
    except ConfigError as e:
        raise ConfigError(as_field_of("scaling", str(e))) from None
