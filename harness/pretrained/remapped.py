"""Training-free context extension by remapped positions, on a Hugging Face causal LM: each query-key pair attends
with RoPE at positions chosen for that pair, so no distance the model sees lies beyond what it trained on. The two
remappings, Self-Extend (Jin et al. 2024) and Dual Chunk Attention (An et al. 2024), are defined once, in
positional/rope_remapped.py, for posbench's own models and these alike.

In both, the pairs' logits are merged before one softmax. transformers rotates q and k at 0 … T − 1 before its
attention function runs; ``remapped_attention`` (registered as an attention implementation) turns them once more by
the position each pair needs minus the one it has (RoPE's rotations compose for one θ: R(a)·R(b) = R(a + b)), with
the frequencies that rotated them: the model's own (``scaling_of``: its rope_parameters, as posbench's rotary computes
them at the sequence's length), rounded by Resonance or selected by HoPE where posbench's rotary applies them. Models
whose rotary is transformers' doubled form over the whole head (Llama, Mistral, Qwen …); others are refused naming
why.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.pretrained.rotary import ScaledRotary, form_of, layer_types_of, rotary_modules, scaling_of
from positional.rope import apply_rope_half, rope_angles
from positional.rope_remapped import Remap

NAME = "posbench_remapped"  # the attention implementation's name in transformers' registry


def apply_remapped(model, remap: Remap) -> None:
    """``remap`` (Self-Extend or DCA, this module's docstring) as ``model``'s attention; put it back with
    ``model.set_attn_implementation`` (hf-eval does after the cell)."""
    [(parent, name)] = rotary_modules(model)
    installed, types = getattr(parent, name), layer_types_of(model.config)
    form, rotated = form_of(installed, types[0])
    head = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if form != "doubled" or rotated != head or len(types) > 1:
        raise ConfigError(
            f"{remap.name()} re-rotates whole heads by one θ in transformers' doubled form; {type(model).__name__} "
            f"rotates {rotated} of {head} dimensions in its {form} form"
            + (f", by a θ per layer type ({', '.join(map(str, types))})" if len(types) > 1 else "")
        )
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, remapped_attention)
    scaling = scaling_of(model.config, rotated=rotated)
    rotary = installed if isinstance(installed, ScaledRotary) else ScaledRotary({None: scaling})  # θ as q, k turned
    for module in model.modules():
        if hasattr(module, "num_key_value_groups"):  # an attention layer
            module.posbench_remap = (remap, scaling, rotary)
    model.set_attn_implementation(NAME)


def remapped_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention function over remapped positions: k (B, H, T, D) rotated at 0 … T − 1, q (B, H, Tq, D)
    at the last Tq of them (Tq = T but in a step decoding with a cache, as generate's)."""
    remap, rope, rotary = module.posbench_remap
    length = key.shape[-2]
    asked = slice(length - query.shape[-2], length)  # the queries' rows of the T × T pairs
    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    theta = rope.frequencies(rotary.theta(rope, query.device), length).inv_freq
    position = torch.arange(length, device=query.device)
    scores = torch.zeros(*query.shape[:-1], length, dtype=query.dtype, device=query.device)
    for at_q, at_k, pairs in remap.parts(position):
        turned = _turn(query, (at_q - position)[asked], theta)
        logits = torch.matmul(turned, _turn(key, at_k - position, theta).transpose(2, 3))
        scores = torch.where(pairs[asked], logits * scaling, scores)
    softcap = kwargs.get("softcap")  # Gemma 2's cap on the attention logits
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    # causal, and within the layer's sliding window where transformers gives one (Mistral's, Qwen2's sliding layers)
    apart = position[asked, None] - position[None, :]
    scores = scores.masked_fill((apart < 0) | (apart >= (kwargs.get("sliding_window") or length)), float("-inf"))
    if attention_mask is not None:
        mask = attention_mask[..., :length]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _turn(x: Tensor, by: Tensor, theta: Tensor) -> Tensor:
    """x (B, H, T, D) in the doubled form (RoPE's half layout), each position t turned by ``by[t]`` positions more."""
    angles = rope_angles(by, theta)  # (T, D/2), theta's fp64
    return apply_rope_half(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype))
