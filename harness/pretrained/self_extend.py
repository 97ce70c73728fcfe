"""Self-Extend on a Hugging Face causal LM: attention over neighbours at their own positions, beyond a window at
grouped ones (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arXiv:2401.01325, §3 and Eq. 4–5), training-free.

A query at position i and a key at position j with i − j < W (the neighbour window) attend with RoPE at i and j as
trained. Farther pairs attend with the query at ⌊i/G⌋ + W − ⌊W/G⌋ and the key at ⌊j/G⌋ (G: the group size): grouped
distances that continue the window's, so every distance the model sees stays within ⌊(T − 1)/G⌋ + W − ⌊W/G⌋. The
two logit matrices are merged pair by pair before one softmax.

transformers rotates q and k at i and j before its attention function runs; ``self_extend_attention`` (registered
as an attention implementation) rotates them once more by the position each grouped pair needs minus the one it has
(RoPE's rotations compose: R(a)·R(b) = R(a + b)), with the model's own frequencies (``scaling_of``: its
rope_parameters, as posbench's rotary computes them at the sequence's length). Models whose rotary is transformers'
doubled form and rotates the whole head (Llama, Mistral, Qwen …); others are refused naming why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.errors import ConfigError
from harness.pretrained.rotary import form_of, rotary_modules, scaling_of
from positional.rope import rope_inv_freq
from positional.rope_scaling import RopeScaling

NAME = "posbench_self_extend"  # the attention implementation's name in transformers' registry


@dataclass(frozen=True)
class SelfExtend:
    group: int  # G
    window: int  # W, the neighbour window
    scaling: RopeScaling  # the model's own RoPE, whose frequencies the extra rotations use

    def positions(self, length: int, device=None) -> tuple[Tensor, Tensor]:
        """(the grouped query positions, the grouped key positions) of positions 0 … length − 1."""
        i = torch.arange(length, device=device)
        return i // self.group + self.window - self.window // self.group, i // self.group


def apply_self_extend(model, group: int, window: int) -> SelfExtend:
    """Self-Extend on ``model`` (this module's docstring), with group size ``group`` and neighbour window
    ``window``; ``restore(model, implementation)`` puts its attention back."""
    if group < 1 or window < 1:
        raise ConfigError(f"Self-Extend needs a group size ≥ 1 and a window ≥ 1, not {group} and {window}")
    [(parent, name)] = rotary_modules(model)
    form, rotated = form_of(getattr(parent, name), None)
    head = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if form != "doubled" or rotated != head:
        raise ConfigError(
            f"Self-Extend re-rotates whole heads in transformers' doubled form; {type(model).__name__} rotates "
            f"{rotated} of {head} dimensions in its {form} form"
        )
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, self_extend_attention)
    extend = SelfExtend(group, window, scaling_of(model.config, rotated=rotated))
    for module in model.modules():
        if hasattr(module, "num_key_value_groups"):  # an attention layer
            module.posbench_self_extend = extend
    model.set_attn_implementation(NAME)
    return extend


def restore(model, implementation: str) -> None:
    model.set_attn_implementation(implementation)


def self_extend_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' attention function with Self-Extend: q, k (B, H, T, D) rotated at their positions 0 … T − 1."""
    extend: SelfExtend = module.posbench_self_extend
    length = query.shape[-2]
    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    theta = extend.scaling.frequencies(
        rope_inv_freq(extend.scaling.rotated or 0, extend.scaling.base or 0.0, torch.float64, query.device), length
    ).inv_freq
    position = torch.arange(length, device=query.device)
    grouped_q, grouped_k = extend.positions(length, query.device)
    near = torch.matmul(query, key.transpose(2, 3)) * scaling
    far = torch.matmul(
        _turn(query, grouped_q - position, theta), _turn(key, grouped_k - position, theta).transpose(2, 3)
    )
    distance = position[:, None] - position[None, :]
    scores = torch.where(distance < extend.window, near, far * scaling)
    scores = scores.masked_fill(distance < 0, float("-inf"))  # causal
    if attention_mask is not None:
        mask = attention_mask[..., :length]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _turn(x: Tensor, by: Tensor, theta: Tensor) -> Tensor:
    """x (B, H, T, D) in the doubled form, each position t turned by ``by[t]`` positions more."""
    angles = by[:, None].double() * theta  # (T, D/2)
    cos, sin = torch.cat((angles, angles), -1).cos().to(x.dtype), torch.cat((angles, angles), -1).sin().to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
