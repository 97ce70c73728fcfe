"""Room: pretrained — posbench's positional schemes applied to a Hugging Face causal LM's own weights (issue 47).

Owns: reading a model's RoPE from its config (``rotary``: base, rotated width, and its ``rope_parameters`` as a
posbench ``RopeScaling``) and swapping the model's rotary module for one that takes posbench's frequencies, so
every length scaling posbench implements (PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE) runs on pretrained
weights exactly as on posbench's own models; and transformers v5's ``rope_parameters`` (flat or per layer type) read
into posbench's per-layer patterns and written from a posbench model (``rope_parameters``). transformers is never
imported here: the model is duck-typed.

Also: evaluating such a model under each scaling and factor, as the PI / NTK / YaRN / LongPPL papers did
(``posbench hf-eval``): the command, its checks and the MLflow runs (``evaluate``), what is measured (``measures``:
perplexity by length with sliding windows, LongPPL's key tokens, passkey retrieval), what it will cost before a
weight is read (``budget``), PI's short fine-tune (``finetune``) and the report with the claim's verdict
(``report``).

May import: positional, attention (the layers it writes as rope_parameters), harness.data (the evaluation text),
harness.record (the evaluation's MLflow runs), and the ground.
"""
