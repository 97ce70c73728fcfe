"""Room: positional schemes — one file per scheme, each the paper's definition, behind three hooks.

Owns: the scheme interface (``base``: embed / rotary / logit-bias hooks and their declarations; each option room's
interface is its ``base``, as attention/base.py and harness/data/tasks/base.py), every scheme
(conf/pos/<name>.yaml ↔ positional/<name>.py) with their pure maths functions, RoPE's length scalings
(``rope_scaling``, conf/pos/scaling/<method>.yaml), RoPE's positions remapped per query-key pair by Self-Extend and
Dual Chunk Attention (``rope_remapped``), and randomized positions, a wrapper any scheme takes (``randomized``).

May import: nothing of the project but the ground (harness.errors, harness.ranges).
"""

from positional.alibi import ALiBi
from positional.base import FarField, LogitBias, PositionalBias, PositionalScheme, RelativeBias, Rotary, Shape
from positional.cope import CoPE
from positional.fire import Fire
from positional.kerple import Kerple
from positional.learned import Learned
from positional.none import NoPosition
from positional.p_rope import PRope
from positional.rope import Rope
from positional.rope_scaling import RopeScaling
from positional.rope_trainable import RopeTrainable
from positional.sinusoidal import Sinusoidal
from positional.t5 import T5Bias
from positional.xl import TransformerXL
from positional.xpos import XPos

__all__ = [
    # the interface (positional.base)
    "PositionalScheme",
    "Shape",
    "Rotary",
    "LogitBias",
    "RelativeBias",
    "PositionalBias",
    "FarField",
    # the schemes, one per conf/pos/<name>.yaml
    "ALiBi",
    "CoPE",
    "Fire",
    "Kerple",
    "Learned",
    "NoPosition",
    "PRope",
    "Rope",
    "RopeScaling",
    "RopeTrainable",
    "Sinusoidal",
    "T5Bias",
    "TransformerXL",
    "XPos",
]
