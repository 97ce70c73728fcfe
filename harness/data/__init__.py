"""Room: data — what the model reads.

Owns: text corpora and their splits (``corpus``), the tokenizer, training and evaluation windows and
their loaders (``windows``), the training objectives (``objectives``: masked and causal LM), and the
position-sensitive synthetic tasks.

May import: the ground only (harness.errors, harness.paths).
"""
