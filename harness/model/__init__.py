"""Room: model — the network, how it learns, and how it is scored.

Owns: the transformer that calls a positional scheme's hooks and an attention variant (``transformer``),
per-layer patterns of schemes and variants (``layers``: pos.layers, attn.layers), length-scaled attention
temperature (``temperature``), the LightningModule with its throughput (``module``), a batch's
training loss and the cross-entropy a chunk of tokens at a time (``loss``), the learning-rate schedule and the
optimizer's parameter groups (``schedule``), positional
configurations that change at stated steps (``phases``), evaluation beyond the validation split (``evaluate``: a
trained model's lengths and tasks; ``extrapolation``: sliding windows, loss by position, same targets, the same
model under every RoPE scaling, a short fine-tune), how training shows progress (``progress``: a bar, or lines in a
log), and the attention diagnostics of a trained model with their figures (``diagnostics``).

May import: positional, attention, harness.data, and the ground.
"""
