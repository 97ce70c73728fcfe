"""The learning-rate schedule (conf/optim ``schedule``): linear warmup, then cosine or linear decay."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from harness.errors import ConfigError


@dataclass
class Schedule:
    """Linear warmup, then cosine or linear decay to ``min_lr_ratio`` × lr at ``total_steps``."""

    warmup_steps: int = 30
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.schedule.warmup_steps={self.warmup_steps} must be ≥ 0")
        if self.decay not in ("cosine", "linear", "constant"):
            raise ConfigError(f"optim.schedule.decay={self.decay!r}: use cosine, linear or constant")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.schedule.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")

    def factor(self, step: int, total_steps: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1 - progress
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * shape
