"""Room: data — what the model reads.

Owns: text corpora and their splits (``corpus``; Hugging Face datasets: ``hf``; whether the Hub answers: ``hub``),
the tokenizers (``tokenizer``: bytes; ``subword``: BPE, WordPiece, Hugging Face), training and evaluation windows
and their loaders (``windows``, ``loaders``), pre-tokenized shards (``shards``, written by ``prepare``; their
loader is timed by harness/bench/loader.py), the training objectives (``objectives``: masked and causal LM), and the
position-sensitive synthetic tasks.

May import: the ground only (harness.errors, harness.paths, harness.extras).
"""
