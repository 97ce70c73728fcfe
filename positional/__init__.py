"""Room: positional schemes — one file per scheme, each the paper's definition, behind three hooks.

Owns: the scheme interface (``base``: embed / rotary / logit-bias hooks and their declarations) and
every scheme (conf/pos/<name>.yaml ↔ positional/<name>.py), with their pure maths functions.

May import: nothing of the project but the ground (harness.errors).
"""
