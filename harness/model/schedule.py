"""The learning-rate schedule (conf/optim ``schedule``): linear warmup, then cosine or linear decay; and the
parameter groups the optimizer steps (training's and the benchmarks')."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from harness.ranges import NonNegativeInt, Range, check_fields

if TYPE_CHECKING:
    from harness.model.transformer import Transformer


@dataclass
class Schedule:
    """Linear warmup, then cosine or linear decay to ``min_lr_ratio`` × lr at ``total_steps``. Each field's type and
    range is its annotation (harness/ranges.py), checked when the config is loaded and, by ``__post_init__``, when a
    Schedule is built from Python, in the same words."""

    warmup_steps: NonNegativeInt = 30
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: Annotated[float, Range("in [0, 1]", ge=0, le=1, verb="lie")] = 0.1

    def __post_init__(self):
        check_fields(self, "optim.schedule")

    def factor(self, step: int, total_steps: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1 - progress
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * shape


def parameter_groups(model: Transformer) -> list[dict]:
    """The optimizer's parameter groups, training's and the benchmarks': ``model``'s trainable parameters, with no
    weight decay on biases and norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]  # biases, norms
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
