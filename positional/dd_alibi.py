"""Data-dependent ALiBi as x-transformers has it (``DataDependentAlibi``, after Lin et al. 2025, "Forgetting
Transformer", ICLR, §2): FoX's bias D_ij = s·Σ_{l=j+1..i} log σ(w_hᵀ x_l + b_h), with b_h = 5 at the start (f ≈ 0.993)
and s = ``post_log_scale``; bidirectional, keys after the query decay by backward gates, s·Σ_{l=i+1..j} log g_l.

What differs from pos=fox (the paper's form): the gate bias starts at ``bias_init`` = 5 (x-transformers' default;
the paper's code starts at 0, f ≈ ½) and the weights at torch's default Linear init (``init_std: null``, as
x-transformers leaves them); log f is multiplied by ``post_log_scale`` (1 by default); and a bidirectional task
is not refused: a second gate projection, H more outputs of the same Linear per layer, is read backwards
(``two_way_forget_bias``), as x-transformers does with ``causal=False``. Everything else — the gates read from
the layer's attention input, one projection per layer, a ``content`` bias (softmax attention only), no position
index read — is FoX's (positional/fox.py).

Notation: as positional/fox.py.
"""

from __future__ import annotations

from harness.ranges import Float32, NonNegative, ranged
from positional.base import Shape
from positional.fox import ForgettingTransformer


class DataDependentALiBi(ForgettingTransformer):
    randomize_refusal = "data-dependent ALiBi reads no position index: its decay is counted by its forget gates"
    bidirectional_refusal = None  # backward gates decay the keys after the query

    @ranged
    def __init__(
        self,
        shape: Shape,
        bias_init: Float32 = 5.0,
        post_log_scale: NonNegative = 1.0,
        init_std: NonNegative | None = None,
    ):
        super().__init__(shape, init_std=init_std, bias_init=bias_init)
        self.post_log_scale = post_log_scale
