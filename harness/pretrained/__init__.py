"""Room: pretrained — posbench's positional schemes applied to a Hugging Face causal LM's own weights.

Owns: reading a model's RoPE from its config (``rotary``: base, rotated width, and its ``rope_parameters`` as a
posbench ``RopeScaling``) and swapping the model's rotary module for one that takes posbench's frequencies, so
every length scaling posbench implements (PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE) runs on pretrained
weights exactly as on posbench's own models; transformers v5's ``rope_parameters`` (flat or per layer type) read
into posbench's per-layer patterns and written from a posbench model (``rope_parameters``); a posbench model
written as a Llama / Qwen3 folder that ``from_pretrained`` loads (``export``); and a model folder as input, its
config.json, weight headers and tokenizer typed and checked before a weight is loaded (``folder``). transformers
is imported only to run a model (``hf_eval``, ``remapped``'s attention registry): the model is duck-typed.

Also: evaluating such a model under each scaling and factor, as the PI / NTK / YaRN / LongPPL papers did (``posbench
hf-eval``): the command, its checks and the MLflow runs (``hf_eval``), what is measured (``measures``: perplexity by
length with sliding windows, LongPPL's key tokens, passkey retrieval), what it will cost before a weight is read
(``cost``), PI's short fine-tune (``finetune``), Self-Extend and Dual Chunk Attention as training-free extensions
beside the scalings (``remapped``: remapped positions per query-key pair), lm-evaluation-harness's tasks on each
cell (``lm_eval_tasks``) and the report with the claim's verdict
(``report``: hf-eval's files, as harness/bench/report.py and results/report.py write their commands' own).

May import: positional, attention (the layers it writes as rope_parameters), harness.data (the evaluation text and
its windows), harness.record (the evaluation's MLflow runs), and the ground.
"""
