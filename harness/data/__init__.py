"""Room: data — what the model reads.

Owns: text corpora and their splits (``corpus``; Hugging Face datasets, and whether the Hub answers: ``hf``), the
tokenizers (``tokenizer``: bytes; ``subword``: BPE, WordPiece, Hugging Face), training and evaluation windows
(``windows``) and their loaders, with token order shuffled inside a window, the check that a model uses positions at
all (``loaders``), pre-tokenized shards (``shards``, written by ``prepare``; their loader is timed by
harness/bench/loader.py), the training objectives and the interfaces a user's ``data=``, ``tokenizer=`` or
``task=`` class implements (``objectives``: masked and causal LM; ``Source``, ``Tokenizer``, ``Task``), and the
position-sensitive synthetic tasks (``tasks``).

May import: the ground only.
"""
