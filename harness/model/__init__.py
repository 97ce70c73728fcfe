"""Room: model — the network, how it learns, and how it is scored.

Owns: the transformer that calls a positional scheme's hooks and an attention variant
(``transformer``), the LightningModule with its loss, optimizer groups and throughput
(``module``), the learning-rate schedule (``schedule``), and evaluation beyond the validation split
(``evaluate``: lengths).

May import: positional, attention, harness.data, and the ground.
"""
