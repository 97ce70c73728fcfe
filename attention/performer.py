"""Performer: FAVOR+ attention (Choromanski et al. 2021, "Rethinking Attention with Performers").

Positive orthogonal random features approximate the softmax kernel exp(qᵀk/√D) (Lemma 1, Eq. 7–8):
    φ(x) = exp(−‖x‖²/2) / √M · (exp(w_1ᵀx), …, exp(w_Mᵀx)),  x scaled by D^(−1/4),
with w_1 … w_M Gaussian rows orthogonalised in blocks of D (§2.4, "ORFs").

From performer-pytorch we take the projection, ``gaussian_orthogonal_random_matrix`` (its rows signed at
random, ``draw_projection``), and not ``FastAttention.forward``: its causal path on CPU materialises (T, M, D)
prefix sums (FACTS.md), its padding only zeroes v so padded keys stay in the normaliser, and it has no place for
numerator-mode RoPE or a Toeplitz bias. The contraction is attention/kernelized.py, shared with ``linear``. φ is
``favor_features``: the numbers of performer-pytorch's ``softmax_kernel`` (tested equal), computed in
one matmul and two in-place passes with a written-out backward, instead of softmax_kernel's ten
elementwise passes over (B, H, T, M) and its (B, H, M, D) copy of the projection.

Two details of ``softmax_kernel`` we pin down:
  * keys are stabilised by one max over all positions of a head; that constant cancels between
    numerator and denominator only without the additive eps, so keys use eps = 0 (with eps, a future
    key could move a past output in causal mode, and a padded key any output);
  * padded keys are zeroed before φ (so that max ignores them) and φ(k) after (kernelized.py).

Redraw: every ``redraw_interval`` optimizer steps the projection is redrawn from seed(base, n), n = step ÷
redraw_interval, where base is drawn once from the global RNG at construction — different per layer, and
identical on every DDP rank because Lightning seeds every rank alike before the model is built. No
broadcast is needed, and a resumed run redraws what it had. The step comes from the training loop through
``before_training_step``, on the host: the forward reads no counter (a read would wait for the GPU).
performer-pytorch counts training forward calls instead: the same without gradient accumulation.

Notation: B batch, H heads, T length, D head dim, M = nb_features.
"""

from __future__ import annotations

import math

import torch
from performer_pytorch.performer_pytorch import gaussian_orthogonal_random_matrix
from torch import Tensor

from attention.kernelized import KernelizedAttention, RopeMode
from harness.errors import ConfigError
from harness.ranges import PositiveInt, ranged
from positional.base import Shape

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio): spreads (base, n) over seed space


def default_nb_features(head_dim: int) -> int:
    """int(D·ln D) as in performer-pytorch (Choromanski et al. 2021, Thm. 4: M = Θ(D log D)), rounded
    up to even so numerator-mode RoPE can rotate feature pairs. D = 32 -> 110, 64 -> 266."""
    m = int(head_dim * math.log(head_dim))
    return max(2, m + m % 2)


def draw_projection(nb_features: int, head_dim: int, seed: int) -> Tensor:
    """Orthogonal Gaussian random features (M, D), a pure function of ``seed`` on any device. The draw takes
    O(M·D²) time: a meta-device build (the checks) does not call it (``Performer.__init__``).

    FAVOR+ is unbiased only if each row is marginally N(0, I_D) (Choromanski et al. 2021, §2.4). QR's Q is not
    Haar-distributed: LAPACK picks the sign of each column from the draw (row m of a block leans towards −e_m), so
    each row's sign is flipped at random, which makes the block Haar again (Mezzadri 2007, "How to Generate Random
    Matrices from the Classical Compact Groups", §5: Q·diag(signs) with the signs independent of Q)."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(seed)
        w = gaussian_orthogonal_random_matrix(nb_features, head_dim, scaling=0)  # (M, D)
        return w * (2 * torch.randint(2, (nb_features, 1)) - 1)  # (M, D), each row ± at random


def favor_features(x: Tensor, projection: Tensor, is_query: bool, eps: float) -> Tensor:
    """φ(x) = M^(−1/2) (exp(w_mᵀx̂ − ‖x̂‖²/2 − s) + eps), x̂ = D^(−1/4)·x: positive random features of the
    softmax kernel (Choromanski et al. 2021, Lemma 1, Eq. 7–8). s, a stabiliser that cancels between
    numerator and denominator: per query the max over features; per (batch, head) the max over keys too.
    x: (B, H, T, D); projection: (M, D) rows w_m. Returns (B, H, T, M).
    """
    return _Favor.apply(x, projection, is_query, eps)


class _Favor(torch.autograd.Function):
    """Forward: one GEMM, then subtract and exp in place. Backward, with e = φ − eps/√M = exp(z)/√M:
    ∂z = g ∘ e; ∂x = ∂z Ŵ − D^(−1/2) x Σ_m ∂z_m (the ‖x̂‖² term), Ŵ = D^(−1/4) W; s is a constant (detached)."""

    @staticmethod
    def forward(ctx, x, projection, is_query, eps):
        c = x.shape[-1] ** -0.25
        w = projection.to(x.dtype) * c  # (M, D)
        u = x @ w.T  # (B, H, T, M)
        stab = u.amax(-1, keepdim=True) if is_query else u.amax((-1, -2), keepdim=True)
        shift = (x * x).sum(-1, keepdim=True) * (c * c / 2) + stab - math.log(projection.shape[0] ** -0.5)
        e = u.sub_(shift).exp_()  # (B, H, T, M): M^(−1/2) exp(z), in place
        ctx.save_for_backward(x, w, e)
        return e + eps * projection.shape[0] ** -0.5 if eps else e

    @staticmethod
    def backward(ctx, grad):
        x, w, e = ctx.saved_tensors
        dz = grad * e  # (B, H, T, M)
        dx = (dz @ w).sub_(x * (dz.sum(-1, keepdim=True) * (x.shape[-1] ** -0.5)))  # (B, H, T, D)
        return dx, None, None, None


def _redraw_seed(base: int, n: int) -> int:
    return (base * _MIX + n) % (1 << 63)


class Performer(KernelizedAttention):
    base_seed: Tensor  # () the seed of every redraw, a buffer (kept in checkpoints)
    projection: Tensor  # (M, D) the projection in use, a buffer

    @ranged
    def __init__(
        self,
        shape: Shape,
        nb_features: PositiveInt | None = None,
        redraw_interval: PositiveInt | None = 1000,
        rope_mode: RopeMode = "pre_feature",
    ):
        """``nb_features``: null for D·ln D; ``redraw_interval``: null never redraws."""
        super().__init__(shape, rope_mode)
        m = default_nb_features(shape.head_dim) if nb_features is None else nb_features
        if rope_mode == "numerator" and m % 2:
            raise ConfigError(f"nb_features={m} is odd but rope_mode=numerator rotates feature pairs; make it even")
        self.nb_features, self.redraw_interval = m, redraw_interval
        self.register_buffer("base_seed", torch.randint(1 << 62, ()))  # from the seeded global RNG, where built
        self.redraws: int | None = None  # n of the projection in use, known on the host once a step has set it
        self.register_buffer("projection", torch.empty(m, shape.head_dim))
        if not self.base_seed.is_meta:  # on meta (the checks' construction) there is no seed's value to draw from
            with torch.no_grad():
                self.projection.copy_(draw_projection(m, shape.head_dim, _redraw_seed(int(self.base_seed), 0)))

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        eps = 1e-4 if is_query else 0.0  # the per-query max cancels exactly either way; see module doc
        return favor_features(x, self.projection, is_query, eps)  # (B, H, T, M)

    @torch.no_grad()
    def before_training_step(self, step: int) -> None:
        if self.redraw_interval is None:
            return
        n = step // self.redraw_interval
        if n != self.redraws:
            if n or self.redraws is not None:  # draw 0 is the constructor's (or a checkpoint's, which holds n's)
                self.projection.copy_(
                    draw_projection(self.nb_features, self.shape.head_dim, _redraw_seed(int(self.base_seed), n))
                )
            self.redraws = n

    def diagnostics(self) -> dict[str, float]:
        return {"feature_redraws": float(self.redraws or 0)}
