"""A user's own package and config directory, outside the repo: a throwaway scheme (a learned linear distance
penalty, b_ij = −softplus(w_h)·|i − j|) as ``mypkg/decay.py``, named by ``myconf/pos/decay.yaml``.

Shared by tests/process/test_bring_your_own.py (through ``python run.py``) and tests/process/test_install.py
(through an installed copy's ``posbench``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

SCHEME = '''
"""Learned linear decay: b_ij = −softplus(w_h)·|i − j|, per head (a throwaway scheme for tests)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import ConfigError
from positional.base import PositionalScheme, bias_over_offsets


class Decay(PositionalScheme):
    bias_kind = "relative"
    bias_depends_on_layer = False

    def __init__(self, shape, init: float = 0.5):
        super().__init__(shape)
        if not init > 0:
            raise ConfigError(f"init={init} must be positive")
        self.w = nn.Parameter(torch.full((shape.n_heads,), math.log(math.expm1(init))))  # softplus(w) = init

    def logit_bias(self, positions, layer):
        offsets = self.offsets(positions).to(self.w.dtype)  # (2S-1,) i - j
        distance = offsets if self.shape.causal else offsets.abs()
        return bias_over_offsets(-F.softplus(self.w)[:, None] * distance[None, :], positions)  # table (H, 2S-1)
'''


def yaml_for(target: str) -> str:
    return textwrap.dedent(f"""\
        # Learned linear decay (a throwaway scheme): b_ij = −softplus(w_h)·|i − j|.
        _target_: {target}
        _partial_: true
        init: 0.5
        """)


def write_user_package(home: Path) -> Path:
    """``home``/mypkg/decay.py (class ``mypkg.decay.Decay``) and ``home``/myconf/pos/decay.yaml; returns home."""
    (home / "mypkg").mkdir(parents=True)
    (home / "mypkg" / "__init__.py").write_text("")
    (home / "mypkg" / "decay.py").write_text(SCHEME)
    (home / "myconf" / "pos").mkdir(parents=True)
    (home / "myconf" / "pos" / "decay.yaml").write_text(yaml_for("mypkg.decay.Decay"))
    return home
