"""A posbench model in Hugging Face transformers' format: ``config.json`` and ``model.safetensors`` that
``AutoModelForCausalLM.from_pretrained(folder)`` loads as LlamaForCausalLM (or Qwen3ForCausalLM with QK-norm).

What maps (checked by ``refusal`` before a run trains, so a run asked to export never finds out at its end):
  the modern block (model=modern: RMSNorm, SwiGLU, no biases, pre-norm), a causal task, softmax attention on
  every layer, one RoPE scheme (no pattern, no partial rotary, no randomized positions, no Resonance/HoPE, no
  evaluation-time length scaling)
  → LlamaForCausalLM; with model.qk_norm=true → Qwen3ForCausalLM (its q_norm, k_norm per head before RoPE).
  model.head=tied → tie_word_embeddings. The rotation: transformers rotates the pairs (x_i, x_{i+D/2}); a model
  trained with pos.layout=interleaved (pairs (x_{2i}, x_{2i+1})) is written with each head's q and k rows (and
  QK-norm weights) permuted evens-then-odds, which maps one layout onto the other exactly: q·k is unchanged
  when q and k are permuted alike, and the permuted pairs are the half layout's.
Names follow transformers' Llama: model.embed_tokens, model.layers.<i>.self_attn.{q,k,v,o}_proj,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm, model.norm, lm_head.

The run's tokenizer goes beside them as ``tokenizer.json`` (the ``tokenizers`` library's file: the byte tokenizer as
a byte-level BPE without merges, each byte its own id; a trained or loaded subword vocabulary as it is) and
``tokenizer_config.json`` (its pad, mask and unknown tokens), so ``AutoTokenizer.from_pretrained(folder)`` encodes
text to the ids the model trained on, and tools that load both (lm-evaluation-harness, ``posbench hf-eval``) need
nothing of posbench.

Nothing here imports transformers (config.json is written by hand); safetensors writes the weights.
"""

from __future__ import annotations

import json

import torch
from torch import Tensor

from harness import integrity
from harness.errors import ConfigError
from harness.pretrained import rope_parameters


def refusal(model, causal: bool) -> str | None:
    """Why ``model`` (a posbench Transformer) has no transformers form, or None."""
    cfg = model.cfg
    block = [
        f"model.{k}={v}"
        for k, v, want in (
            ("norm_type", cfg.norm_type, "rmsnorm"),
            ("mlp", cfg.mlp, "swiglu"),
            ("bias", cfg.bias, False),
            ("norm", cfg.norm, "pre"),
        )
        if v != want
    ]
    if block:
        return f"{block[0]}: transformers' Llama has the modern block (model=modern)"
    names = {v.config_name() for v in model.variants}
    schemes = {id(s): s for s, _ in model.layers()}
    for refused, why in (  # in this order: the first that holds is said
        (
            cfg.head == "bert",
            "model.head=bert: Llama's head is the final norm then a linear layer (model.head=untied or tied)",
        ),
        (cfg.temperature != "none", f"model.temperature={cfg.temperature} has no key in LlamaConfig"),
        (not causal, "a bidirectional task: LlamaForCausalLM is a causal LM (task=clm)"),
        (
            names != {"softmax"},
            f"attn={'+'.join(sorted(names))}: Llama's attention is full softmax attention on every layer",
        ),
        (len(schemes) != 1, "a per-layer pattern (pos.layers): LlamaForCausalLM has one RoPE for every layer"),
    ):
        if refused:
            return why
    scheme = next(iter(schemes.values()))
    if scheme.config_name() != "rope":
        return f"pos={scheme.config_name()}: LlamaForCausalLM applies RoPE (pos=rope)"
    for key in ("resonance", "hope", "randomize", "rotate_heads"):
        if getattr(scheme, key, None):
            return f"pos.{key}: LlamaForCausalLM has no such RoPE option"
    if scheme.fraction != 1.0:
        return f"pos.fraction={scheme.fraction}: LlamaForCausalLM rotates every dimension of a head"
    if scheme.scaling.method != "none":  # model.eval() applies it; the written config.json would not
        return (
            f"pos.scaling={scheme.scaling.method}: the export writes plain RoPE, and the run's final evaluation "
            "applies this scaling, so transformers' logits would differ (eval.scalings scores scalings without it)"
        )
    return None


def hf_config(model, vocab_size: int, max_len: int, tokenizer: str | None = None) -> dict:
    """transformers' config.json of ``model``; ``tokenizer``: posbench's tokenizer option the ids are of, kept as
    ``posbench_tokenizer`` (it marks a posbench export, whose seals ``posbench hf-eval`` checks)."""
    cfg = model.cfg
    qk = bool(cfg.qk_norm)
    rope, _ = rope_parameters.write(model.layers())  # flat: ``refusal`` lets one RoPE on every layer through
    return {
        "architectures": ["Qwen3ForCausalLM" if qk else "LlamaForCausalLM"],
        "model_type": "qwen3" if qk else "llama",
        "vocab_size": vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.d_model // cfg.n_heads,
        "max_position_embeddings": max_len,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.head == "tied",
        "torch_dtype": "float32",
        "rope_parameters": rope,
        **({"posbench_tokenizer": tokenizer} if tokenizer else {}),
    }


def half_order(head_dim: int) -> Tensor:
    """The permutation taking the interleaved layout's dims to the half layout's: evens, then odds."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def _hf_state_dict(model) -> dict[str, Tensor]:
    """transformers' tensors, by name, from a posbench model that ``refusal`` passes."""
    cfg, scheme = model.cfg, model.layers()[0][0]
    c, h = cfg.d_model, cfg.n_heads
    d = c // h
    order = half_order(d) if scheme.layout == "interleaved" else torch.arange(d)
    rows = (torch.arange(h)[:, None] * d + order[None]).flatten()  # each head's rows in the half layout's order
    out = {"model.embed_tokens.weight": model.tok_emb.weight, "model.norm.weight": model.norm_f.weight}
    for i, block in enumerate(model.blocks):
        q, k, v = block.attn.qkv.weight.split(c)
        gate, up = block.ff.gate_up.weight.split(cfg.d_ff)
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": q[rows],
            p + "self_attn.k_proj.weight": k[rows],
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": block.attn.out.weight,
            p + "mlp.gate_proj.weight": gate,
            p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": block.ff.down.weight,
            p + "input_layernorm.weight": block.norm1.weight,
            p + "post_attention_layernorm.weight": block.norm2.weight,
        }
        if cfg.qk_norm:
            out |= {
                p + "self_attn.q_norm.weight": block.attn.q_norm.weight[order],
                p + "self_attn.k_norm.weight": block.attn.k_norm.weight[order],
            }
    if model.decoder is not None:
        out["lm_head.weight"] = model.decoder.weight
    return {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in out.items()}


def hf_files(model, vocab_size: int, max_len: int, causal: bool, tokenizer=None) -> dict[str, str | bytes]:
    """``config.json`` and ``model.safetensors`` of ``model`` and, given the run's ``tokenizer``, its
    ``tokenizer_files``, each with its ``.sha256`` beside it (harness/integrity.py: ``posbench hf-eval`` refuses a
    changed file before loading it; transformers ignores the seals); a one-line ConfigError where it has no such
    form."""
    why = refusal(model, causal)
    if why:
        raise ConfigError(f"export=hf: {why}")
    from safetensors.torch import save

    name = tokenizer.config_name() if tokenizer is not None else None
    return integrity.sealed_files(
        {
            "config.json": json.dumps(hf_config(model, vocab_size, max_len, name), indent=2) + "\n",
            "model.safetensors": save(_hf_state_dict(model), metadata={"format": "pt"}),
            **(tokenizer_files(tokenizer, max_len) if tokenizer is not None else {}),
        }
    )


def tokenizer_files(tokenizer, max_len: int) -> dict[str, str | bytes]:
    """``tokenizer.json`` and ``tokenizer_config.json``: the run's tokenizer as ``AutoTokenizer`` loads it (this
    module's docstring), its pad, mask and unknown tokens named where the vocabulary has them. The pad token is also
    its end-of-sequence token: generation (lm-eval's ``generate_until``) asks for one, and a posbench model, trained on
    packed text, never predicts the pad, so a generation runs to its length limit, as the model would."""
    backend = tokenizer.tokenizer  # a tokenizers.Tokenizer (harness/data/tokenizer.py, harness/data/subword.py)
    ids = {"pad": tokenizer.pad_id, "mask": tokenizer.mask_id, "unk": backend.token_to_id("[UNK]")}
    named = {f"{kind}_token": backend.id_to_token(i) for kind, i in ids.items() if i is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        **named,
        "eos_token": named["pad_token"],
        # a trained vocabulary reads "[MASK]" written in the text as text (harness/data/subword.py): so does the export
        **({"split_special_tokens": True} if backend.encode_special_tokens else {}),
    }
    return {"tokenizer.json": backend.to_str(), "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
