"""export: the tests that train end to end (the rest: tests/unit/test_export.py).

export=hf: a posbench model written in transformers' format loads with AutoModelForCausalLM and gives the same
logits (Llama for the modern block, Qwen3 with QK-norm; RoPE's interleaved layout permuted into the half one);
what has no such form is refused before training; a run's hf_model/ artifacts load from MLflow.
"""

from __future__ import annotations

import torch


def test_a_runs_exported_model_loads_from_its_mlflow_artifacts(train_tiny):
    """Model and tokenizer, as any transformers user loads them: the tokenizer gives the run's byte ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    summary, client = train_tiny("model=modern", "task=clm", "export=hf", "trainer.max_steps=4")
    folder = client.download_artifacts(summary.run_id, "hf_model")
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.vocab_size == 258
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "Positions, naïvely: 漢字"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == list(text.encode()) and tokenizer.pad_token_id == 256
    with torch.no_grad():
        logits = hf(ids).logits
    assert logits.shape == (1, len(text.encode()), 258) and torch.isfinite(logits).all()
