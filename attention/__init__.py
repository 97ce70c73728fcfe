"""Room: attention variants — one signature over (B, H, T, D) tensors, one file per variant.

Owns: the variant interface (``base``: the context, the declared bias kinds and refusals; each option room's
interface is its ``base``, as positional/base.py and harness/data/tasks/base.py), what the kernelized variants
share (``kernelized``: the contractions, only the feature map differing) and every variant
(conf/attn/<name>.yaml ↔ attention/<name>.py).

May import: positional (its interface types), and the ground (harness.errors, harness.ranges).
"""

from attention.base import AttentionContext, AttentionVariant, check_pairing
from attention.kernelized import KernelizedAttention
from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax

__all__ = [
    # the interface (attention.base)
    "AttentionVariant",
    "AttentionContext",
    "KernelizedAttention",
    "check_pairing",
    # the variants, one per conf/attn/<name>.yaml
    "Softmax",
    "Local",
    "Linear",
    "Performer",
]
