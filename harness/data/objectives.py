"""Training objectives (conf/task): how a window of tokens becomes inputs and labels.

Labels use -100 (PyTorch's ignore_index) wherever no prediction is scored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.errors import ConfigError

IGNORE = -100


class MaskedLM:
    """BERT masked-LM (Devlin et al. 2019, §3.1 "Task #1" and Appendix A.1).

    Each real token is selected with probability ``mask_prob``; a selected token becomes
    [MASK] with probability ``p_mask`` (0.8), a uniformly random regular token with
    ``p_random`` (0.1) and stays unchanged otherwise (0.1). Loss only on selected tokens.
    """

    name = "mlm"
    causal = False
    extra_tokens = 0  # a window of T tokens gives T inputs

    def __init__(self, tokenizer, mask_prob: float = 0.15, p_mask: float = 0.8, p_random: float = 0.1):
        if not 0.0 < mask_prob < 1.0:
            raise ConfigError(f"task.mask_prob={mask_prob} must lie in (0, 1); BERT uses 0.15")
        if p_mask < 0 or p_random < 0 or p_mask + p_random > 1:
            raise ConfigError(f"task.p_mask={p_mask} + task.p_random={p_random} must be ≥ 0 and sum to ≤ 1")
        self.tok = tokenizer
        self.mask_prob, self.p_mask, self.p_random = mask_prob, p_mask, p_random

    def make_example(self, window: Tensor, valid: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        """window: (T,) long ids; valid: (T,) bool (False at padding)."""
        u_select, u_action = torch.rand(2, window.shape[0], generator=gen)
        selected = (u_select < self.mask_prob) & valid
        if not selected.any():  # score at least one token per sequence
            selected[int(torch.randint(int(valid.sum()), (1,), generator=gen))] = True
        random_ids = torch.randint(self.tok.n_regular, window.shape, generator=gen)
        inputs = window.clone()
        to_mask = selected & (u_action < self.p_mask)
        to_random = selected & (u_action >= self.p_mask) & (u_action < self.p_mask + self.p_random)
        inputs[to_mask] = self.tok.mask_id
        inputs[to_random] = random_ids[to_random]
        labels = torch.where(selected, window, torch.full_like(window, IGNORE))
        return {"input_ids": inputs, "labels": labels, "key_padding_mask": valid}


class CausalLM:
    """Next-token prediction with a causal mask; every real next token is scored."""

    name = "clm"
    causal = True
    extra_tokens = 1  # a window of T + 1 tokens gives T inputs and T shifted labels

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def make_example(self, window: Tensor, valid: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        labels = torch.where(valid[1:], window[1:], torch.full_like(window[1:], IGNORE))
        return {"input_ids": window[:-1], "labels": labels, "key_padding_mask": valid[:-1]}
