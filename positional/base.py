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
from typing import Literal, Protocol

import torch
from torch import Tensor, nn

BiasKind = Literal["none", "relative", "content"]
HOOKS = ("embed", "rotary", "logit_bias")


@dataclass(frozen=True)
class Shape:
    """What the model tells a scheme (or an attention variant) about its shape."""

    d_model: int
    n_heads: int
    n_layers: int
    max_len: int  # longest sequence seen in training (learned tables are this long)
    causal: bool

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class Rotary(Protocol):
    """A position-dependent linear map applied to q and k (or to φ(q), φ(k))."""

    def rotate(self, x: Tensor) -> Tensor:  # (B, H, T, D) -> (B, H, T, D)
        ...


class LogitBias:
    """An additive contribution to the attention logits, b_ij.

    ``kind`` tells attention variants what they are dealing with:
      relative  b_ij = c[h, i - j]: a Toeplitz matrix per head (T5, ALiBi);
                kernelized attention can honour it without forming T×T.
      content   b_ij depends on q_i and/or k_j as well (Transformer-XL).
    """

    kind: BiasKind = "content"

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
            i = torch.arange(self.t_q, device=self.table.device)[:, None]
            j = torch.arange(self.t_k, device=self.table.device)[None, :]
            self._dense = self.table[:, i - j + self.t_k - 1].unsqueeze(0)  # (1, H, Tq, Tk)
        return self._dense


def relative_offsets(t_q: int, t_k: int, device=None) -> Tensor:
    """The offsets i - j covered by a RelativeBias table: -(Tk-1) … (Tq-1)."""
    return torch.arange(-(t_k - 1), t_q, device=device)


class PositionalScheme(nn.Module):
    """Base class. Subclasses take ``shape: Shape`` first; other args come from conf/pos."""

    bias_kind: BiasKind = "none"  # what ``logit_bias`` returns, declared for the compatibility check

    def __init__(self, shape: Shape):
        super().__init__()
        self.shape = shape

    @classmethod
    def config_name(cls) -> str:
        """conf/pos/<name>.yaml pairs with positional/<name>.py."""
        return cls.__module__.rsplit(".", 1)[-1]

    @classmethod
    def hooks(cls) -> frozenset[str]:
        """The hooks this scheme overrides (derived, so it cannot drift from the code)."""
        return frozenset(h for h in HOOKS if getattr(cls, h) is not getattr(PositionalScheme, h))

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, C) token embeddings; positions: (T,) long. Returns (B, T, C)."""
        return x

    def rotary(self, positions: Tensor) -> Rotary | None:
        """Called once per forward; the result is shared by every layer."""
        return None

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

    def diagnostics(self) -> dict[str, float]:
        """Scalars logged as ``pos/<key>`` at every training log step (e.g. θ drift)."""
        return {}

    def artifacts(self) -> dict[str, str]:
        """Files (name -> text) attached to the MLflow run when training ends."""
        return {}
