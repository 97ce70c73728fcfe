"""The positional-scheme interface: three optional hooks, each a no-op by default.

A scheme may
  (a) add to the token embeddings            -> ``embed``
  (b) rotate/transform queries and keys      -> ``rotary``
  (c) contribute a bias to attention logits  -> ``logit_bias``
The model calls all three; a scheme overrides the ones it needs. Nothing outside a
scheme branches on which scheme it is: attention variants read the declarations
(``hooks()`` and ``bias_kind``) to decide what they can honour.

Notation: B batch, T sequence length, H heads, D head dim, C model width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.errors import ConfigError, IncompatiblePairing

BiasKind = Literal["none", "relative", "positional", "content"]
EvalPositions = Literal["sampled", "ordered"]
HOOKS = ("embed", "rotary", "logit_bias")


@dataclass(frozen=True)
class Sampling:
    """Ruoss et al. 2023, §3: each forward's T positions a sorted sample without replacement from [0,
    max_position), one draw per forward shared by every hook and layer (``randomized_positions``).
    ``eval_positions``: ``sampled`` (evaluation draws too, from its own generator, reseeded at every switch to
    evaluation, as the paper's reference code) or ``ordered`` (evaluation at 0 … T−1). Set by the wrapper of any
    scheme's factory (positional/randomized.py); a scheme reads it from its ``Shape``."""

    max_position: int
    eval_positions: EvalPositions = "sampled"


@dataclass(frozen=True)
class Shape:
    """What the model tells a scheme (or an attention variant) about its shape."""

    d_model: int
    n_heads: int
    n_layers: int
    max_len: int  # longest sequence seen in training (learned tables are this long)
    causal: bool
    # Packed documents (model.restart_positions, model.document_mask): positions restart at each document's first
    # token, (B, T) per row (``document_positions``); attention stops at document boundaries
    restart_positions: bool = False
    document_mask: bool = False
    # Randomized positions (positional/randomized.py): the positions of a forward are a sorted sample from
    # [0, sampling.max_position); None: 0 … T−1
    sampling: Sampling | None = None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Rotary:
    """A position-dependent linear map applied to q and k (or to φ(q), φ(k)).

    Attention variants call ``rotate_q`` on queries and ``rotate_k`` on keys. Both are ``rotate``
    unless a scheme maps them differently (xPos scales q by ζ^(n/B) and k by ζ^(−m/B)).
    ``widens``: the maps return (B, H, T, W) with W > D, features whose dot product is the score
    (PoPE); only variants that take q̃ᵀk̃ at any width apply them (``AttentionVariant.wide_rotary_refusal``).
    """

    widens: bool = False

    def rotate(self, x: Tensor) -> Tensor:  # (B, H, T, D) -> (B, H, T, D)
        raise NotImplementedError

    def rotate_q(self, x: Tensor) -> Tensor:
        return self.rotate(x)

    def rotate_k(self, x: Tensor) -> Tensor:
        return self.rotate(x)


class LogitBias:
    """An additive contribution to the attention logits, b_ij.

    ``kind`` tells attention variants what they are dealing with:
      relative    b_ij = c[h, i - j]: a Toeplitz matrix per head (T5, ALiBi);
                  kernelized attention can honour it without forming T×T.
      positional  b_ij depends on the positions only, but not on i - j alone (FIRE's normaliser
                  reads i; any relative scheme under randomized positions reads p_i - p_j):
                  offered as dense logits only.
      content     b_ij depends on q_i and/or k_j as well (Transformer-XL, CoPE), or on the layer's input
                  (FoX's forget gates, read through ``for_input``).
    """

    kind: BiasKind = "content"

    def for_input(self, x: Tensor) -> LogitBias:
        """The bias of a layer whose attention input is x (B, T, C), the tensor q, k and v are projected from;
        the model calls it in every layer before attention. A bias that reads positions or q, k only is
        itself; one made of the input (FoX's gates σ(W x_t + b)) returns a bias holding what it read."""
        return self

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        """The full bias, broadcastable to (B, H, Tq, Tk)."""
        raise NotImplementedError


@dataclass(frozen=True)
class FarField:
    """What a relative bias is beyond ``distance``: linear in |i − j| on each side,
    b_o = b_{±distance} − slope · (|o| − distance) for |o| ≥ distance (+ for i − j > 0, − for i − j < 0).

    A scheme that declares it lets kernelized attention weight far keys by decayed prefix sums instead of
    a Toeplitz FFT (attention/kernelized.py, ``band_contract``). T5: its buckets are constant from
    max_distance on (slope 0); ALiBi: −m_h·|i − j| from distance 0 (slope m_h).
    """

    distance: int
    slope: Tensor  # (2, H): row 0 for i − j > 0 (past keys), row 1 for i − j < 0 (future keys)


class RelativeBias(LogitBias):
    """b_ij = c[h, i - j + (Tk - 1)]: a schemes supplies the per-offset table only."""

    kind: BiasKind = "relative"

    def __init__(self, table: Tensor, t_q: int, t_k: int, far: FarField | None = None):
        self.table = table  # (H, Tq + Tk - 1); column o holds offset i - j = o - (Tk - 1)
        self.t_q, self.t_k = t_q, t_k
        self.far = far  # None: no structure declared beyond the table itself
        self._dense: Tensor | None = None

    def dense(self, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        """Built once per object: layers that share a bias share one gather (and one scatter in backward)."""
        if self._dense is None:
            self._dense = toeplitz_dense(self.table, self.t_q, self.t_k).unsqueeze(0)  # (1, H, Tq, Tk)
        return self._dense


class PositionalBias(LogitBias):
    """A bias that depends on positions only, held densely: b_ij = values[0, h, i, j]."""

    kind: BiasKind = "positional"

    def __init__(self, values: Tensor):
        self.values = values  # (1, H, Tq, Tk), or (B, H, Tq, Tk) for positions per row

    def dense(self, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        return self.values


def toeplitz_dense(coeffs: Tensor, t_q: int, t_k: int) -> Tensor:
    """The Toeplitz matrices themselves: C[h, i, j] = coeffs[h, i − j + Tk − 1]. (H, Tq + Tk − 1) -> (H, Tq, Tk)."""
    offsets = torch.arange(t_q, device=coeffs.device)[:, None] - torch.arange(t_k, device=coeffs.device) + t_k - 1
    return coeffs[:, offsets]


def later_keys(t_q: int, t_k: int, device=None) -> Tensor:
    """(Tq, Tk) bool, True where the key comes after the query (j > i): what a causal mask hides."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1)


def document_positions(document_ids: Tensor) -> Tensor:
    """Positions that restart at each packed document: p_t = t − (the index of the first token of t's document).
    ``document_ids``: (B, T), equal within a document, changing where one starts. Returns (B, T) long; a row
    holding one document gets 0 … T−1. Nothing is read on the host (cummax, no .item())."""
    t = torch.arange(document_ids.shape[-1], device=document_ids.device).expand_as(document_ids)  # (B, T)
    first = F.pad(document_ids[:, 1:] != document_ids[:, :-1], (1, 0), value=True)  # (B, T) True at each first token
    return t - torch.where(first, t, torch.zeros_like(t)).cummax(dim=-1).values


def bias_over_offsets(table: Tensor, positions: Tensor, far: FarField | None = None) -> LogitBias:
    """b_ij = table[h, p_i - p_j + S - 1] for a table over the offsets ``PositionalScheme.offsets`` gives, (H, 2S-1).

    Consecutive positions give the Toeplitz ``RelativeBias``; sampled ones (randomized positions,
    Ruoss et al. 2023) a ``PositionalBias``: p_i - p_j is no function of i - j there. ``far``: the
    table's structure beyond the band (``FarField``), kept for the Toeplitz case only. Positions per row
    (B, T), restarting at packed documents (``document_positions``), give a (B, H, T, T) ``PositionalBias``.
    """
    t, span = positions.shape[-1], (table.shape[-1] + 1) // 2
    if positions.dim() == 1 and span == t:  # sorted, distinct and spanning T positions: consecutive
        return RelativeBias(table, t, t, far)
    # sampled, or per row (offsets p_i − p_j of restarted positions lie in −(T−1) … T−1)
    rows = positions.reshape(-1, t)  # (1 or B, T)
    index = rows[:, :, None] - rows[:, None, :] + span - 1  # (1 or B, T, T)
    return PositionalBias(table[:, index].transpose(0, 1))  # (1 or B, H, T, T)


def randomized_positions(t: int, max_position: int, generator: torch.Generator | None = None) -> Tensor:
    """T positions drawn without replacement from [0, max_position), sorted (Ruoss et al. 2023, §3).

    Drawn on the CPU from ``generator`` (torch's global one by default), so a seeded run (and its resume,
    which restores that generator) draws the same positions on any device. Shape (T,), long.
    """
    return torch.randperm(max_position, generator=generator)[:t].sort().values


EVAL_SEED = 0  # every evaluation pass of a randomized model starts its own draws from this seed


class PositionalScheme(nn.Module):
    """Base class. Subclasses take ``shape: Shape`` first; other args come from conf/pos.

    Randomized positions (Ruoss et al. 2023) are not an argument of any scheme: the wrapper
    positional/randomized.py puts a ``Sampling`` into the ``Shape`` a scheme is built with, for any scheme that
    reads positions (one that does not declares ``randomize_refusal``). Drawn positions then reach every hook,
    and a relative (Toeplitz) bias depends on p_i - p_j: the instance declares ``positional``.
    """

    bias_kind: BiasKind = "none"  # what ``logit_bias`` returns, declared for the compatibility check
    # Why pos.randomize=true means nothing for this scheme (None: it reads positions, so it can)
    randomize_refusal: ClassVar[str | None] = None
    # True when ``rotary`` widens q and k (``Rotary.widens``): declared for the compatibility check
    rotary_widens: ClassVar[bool] = False
    # Why the scheme is defined for causal attention only (None: bidirectional tasks too); a bidirectional
    # task (task=mlm, an encoder form) is then refused as an incompatible pairing, with this reason
    bidirectional_refusal: ClassVar[str | None] = None
    # Position tables kept in float64 when the model is cast to another dtype (``_apply``): angles m·θ at long m
    float64_state: ClassVar[tuple[str, ...]] = ()
    # Why positions cannot restart at packed documents (model.restart_positions; None: the hooks take positions
    # per row, (B, T)). A scheme that reads no position index (none, CoPE, FoX) has nothing to restart and accepts it
    restart_refusal: ClassVar[str | None] = None

    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape
        if self.bidirectional_refusal and not shape.causal:
            raise IncompatiblePairing(
                f"incompatible pairing: pos={self.config_name()} with a bidirectional task: "
                f"{self.bidirectional_refusal}; use a causal task (task=clm, or "
                "task.form=causal) or another pos"
            )
        if shape.sampling is not None:
            check_sampling(type(self), shape, True, shape.sampling.max_position, shape.sampling.eval_positions)
        if shape.restart_positions and self.restart_refusal:  # this scheme cannot take positions per row
            raise IncompatiblePairing(
                f"incompatible pairing: model.restart_positions=true with pos={self.config_name()}: "
                f"{self.restart_refusal}; set model.restart_positions=false or use another pos"
            )
        if shape.restart_positions and self.randomize:
            raise ConfigError(
                "model.restart_positions=true with pos.randomize=true: randomized positions are drawn once "
                "per window, not per document; drop one of the two"
            )
        if (self.randomize or shape.restart_positions) and self.bias_kind == "relative":
            self.bias_kind = "positional"  # c[p_i − p_j] over sampled or restarted p is no Toeplitz matrix in (i, j)
        self._eval_draws = torch.Generator().manual_seed(EVAL_SEED)  # CPU, like the training draws

    @property
    def randomize(self) -> bool:
        """Whether positions are randomized (``Shape.sampling``)."""
        return self.shape.sampling is not None

    @property
    def eval_positions(self) -> EvalPositions | None:
        return self.shape.sampling.eval_positions if self.shape.sampling is not None else None

    def _apply(self, fn, recurse: bool = True):
        """``model.to(torch.bfloat16)`` (trainer.precision=bf16-true) casts every floating tensor; the tensors named
        in ``float64_state`` keep float64 and only move device. In bf16, RoPE's θ_0·m at m = 8192 would be off by
        radians (tests/unit/test_bf16.py)."""
        kept = {name: getattr(self, name).detach().clone() for name in self.float64_state}
        super()._apply(fn, recurse)
        for name, value in kept.items():
            now = getattr(self, name)
            if now.dtype != value.dtype:
                now.data = value.to(now.device)  # in place: a Parameter stays the optimizer's, a buffer the module's
        return self

    def train(self, mode: bool = True):
        if not mode:  # each evaluation pass draws the same positions, whenever it runs
            self._eval_draws.manual_seed(EVAL_SEED)
        return super().train(mode)

    @property
    def sampling(self) -> bool:
        """Whether this forward's positions are drawn: training under randomize, and evaluation too unless
        eval_positions=ordered."""
        return self.randomize and (self.training or self.eval_positions == "sampled")

    @property
    def position_range(self) -> int:
        """How many distinct positions training can show: max_position if randomized, else data.seq_len."""
        return self.shape.sampling.max_position if self.shape.sampling is not None else self.shape.max_len

    def offsets(self, positions: Tensor) -> Tensor:
        """The offsets p_i - p_j a relative table over ``positions`` must cover: -(S-1) … S-1, S = p_last - p_first + 1
        for sorted positions (T,); for 0 … T-1 (S = T) a RelativeBias table's columns.

        Unless positions are randomized the model hands every hook 0 … T-1, so S = T and no position value is read
        (reading one would synchronise a GPU on every forward)."""
        # positions restarted per document (B, T) lie in 0 … T−1 too
        span = int(positions[-1] - positions[0]) + 1 if self.randomize else positions.shape[-1]
        return torch.arange(-(span - 1), span, device=positions.device)

    def positions(self, t: int, device=None) -> Tensor:
        """The positions of a length-T input, (T,) long: called once per forward, handed to every hook."""
        if self.sampling:  # drawn from [0, max_position), which is the position range
            if t > self.position_range:
                ordered = "" if self.training else " or set pos.eval_positions=ordered"
                raise ConfigError(
                    f"max_position={self.position_range} < sequence length {t}: T distinct "
                    f"positions cannot be drawn; raise max_position{ordered}"
                )
            return randomized_positions(t, self.position_range, None if self.training else self._eval_draws).to(device)
        return torch.arange(t, device=device)

    @classmethod
    def config_name(cls) -> str:
        """conf/pos/<name>.yaml pairs with positional/<name>.py."""
        return cls.__module__.rsplit(".", 1)[-1]

    @classmethod
    def hooks(cls) -> frozenset[str]:
        """The hooks this scheme overrides (derived, so it cannot drift from the code)."""
        return frozenset(h for h in HOOKS if getattr(cls, h) is not getattr(PositionalScheme, h))

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, C) token embeddings; positions: (T,) long, or (B, T) restarted per packed document
        (``document_positions``; every hook takes either). Returns (B, T, C)."""
        return x

    def rotary(self, positions: Tensor) -> Rotary | None:
        """The rotation every layer applies (called through ``rotaries``)."""
        return None

    def rotaries(self, positions: Tensor, n_layers: int) -> list[Rotary | None]:
        """Called once per forward: one rotation per layer, the same object for all unless a per-layer pattern
        (harness/model/layers.py) gives its layers different schemes."""
        return [self.rotary(positions)] * n_layers

    def logit_bias(self, positions: Tensor, layer: int) -> LogitBias | None:
        """The bias of one layer (called through ``logit_biases``)."""
        return None

    # False when logit_bias ignores ``layer``: then every layer gets the same object, and what it
    # builds lazily (a dense T×T bias) is built once per forward, not once per layer
    bias_depends_on_layer: bool = True

    def logit_biases(self, positions: Tensor, n_layers: int) -> list[LogitBias | None]:
        """Called once per forward: one bias per layer."""
        if not self.bias_depends_on_layer:
            return [self.logit_bias(positions, 0)] * n_layers
        return [self.logit_bias(positions, layer) for layer in range(n_layers)]

    # The eval-time length scalings ``rescaled`` accepts (RoPE's: positional/rope_scaling.py); none here
    length_scalings: tuple[str, ...] = ()  # a class's; a per-layer pattern's is its layers' (harness/model/layers.py)

    def rescaled(self, method: str, length: int, in_training: bool = False):
        """A context manager under which the scheme applies length scaling ``method`` for inputs of
        ``length`` (eval.scalings, harness/model/extrapolation.py); schemes without one refuse."""
        raise ConfigError(
            f"eval.scalings needs a positional scheme with length scalings; pos={self.config_name()} "
            "has none (only RoPE's angles can be rescaled): drop eval.scalings or use pos=rope"
        )

    def diagnostics(self) -> dict[str, float]:
        """Scalars logged as ``pos/<key>`` at every training log step (e.g. θ drift)."""
        return {}

    def artifacts(self) -> dict[str, str]:
        """Files (name -> text) attached to the MLflow run when training ends."""
        return {}


def check_sampling(
    cls: Any, shape: Shape, randomize: bool, max_position: int | None, eval_positions: str | None
) -> Sampling | None:
    """Validate pos.randomize / pos.max_position / pos.eval_positions before anything is built; one-line errors.
    Returns the sampling they ask for (None: positions 0 … T−1)."""
    if not isinstance(randomize, bool):
        raise ConfigError(f"randomize={randomize!r}: use true or false")
    if eval_positions not in (None, "sampled", "ordered"):
        raise ConfigError(f"eval_positions={eval_positions!r}: use sampled or ordered (or null: sampled)")
    if not randomize:
        for key, value in (("max_position", max_position), ("eval_positions", eval_positions)):
            if value is not None:
                raise ConfigError(f"{key}={value} only applies with randomize=true; set randomize=true or drop {key}")
        return None
    if getattr(cls, "randomize_refusal", None):
        raise ConfigError(
            f"randomize=true with pos={cls.config_name()}: {cls.randomize_refusal}; "
            "use randomize=false or a scheme that reads positions"
        )
    if not isinstance(max_position, int) or max_position < shape.max_len:
        raise ConfigError(
            f"randomize=true needs max_position ≥ the training length {shape.max_len} (data.seq_len) "
            f"(got {max_position}); positions are drawn from [0, max_position)"
        )
    return Sampling(max_position, "ordered" if eval_positions == "ordered" else "sampled")
