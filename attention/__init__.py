"""Room: attention variants — one signature over (B, H, T, D) tensors, one file per variant.

Owns: the variant interface (``base``: the context, the declared bias kinds and refusals) and every
variant (conf/attn/<name>.yaml ↔ attention/<name>.py), including the kernelized contractions.

May import: positional (its interface types), and the ground (harness.errors).
"""
