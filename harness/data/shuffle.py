"""Token-order shuffling inside one example: the check that a model uses positions at all.

A model that uses word order loses accuracy when the order inside each validation window is
permuted; the loss gap (``val/order_gain`` = shuffled − plain, nats per token) measures it. The
permutation is drawn from a caller's fixed generator, so every validation scores the same text.

- Masked LM and encoder-form tasks (labels aligned with inputs): ``shuffle_within_window`` moves
  inputs and labels by one permutation, so a masked target travels with its [MASK] slot.
- Causal LM: the *raw window* is permuted before the input/label shift (``shuffle_tokens``, then
  ``CausalLM.make_example``): the targets are the next tokens of the permuted text.
  ``shuffle_within_window(..., causal=True)`` does the same on a built example (e.g. a causal
  synthetic task): it rebuilds the raw text, permutes it, shifts again, and each scored target token
  keeps its score wherever it lands (the token landing at position 0 cannot be predicted).

Padding never moves: only real positions are permuted among themselves.

Notation: T sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.data.objectives import IGNORE


def real_permutation(valid: Tensor, gen: torch.Generator) -> Tensor:
    """(T,) bool -> (T,) long index map: a uniform permutation of the real positions; padding maps to itself."""
    index = torch.arange(len(valid))
    real = valid.nonzero().squeeze(1)
    index[real] = real[torch.randperm(len(real), generator=gen)]
    return index


def shuffle_tokens(window: Tensor, valid: Tensor, gen: torch.Generator) -> Tensor:
    """A raw window (T,) with its real tokens in random order (for CausalLM: before make_example)."""
    return window[real_permutation(valid, gen)]


def shuffle_within_window(example: dict[str, Tensor], gen: torch.Generator, causal: bool = False) -> dict:
    """The example with its real tokens permuted; other fields unchanged. See the module docstring."""
    if causal:
        return {**example, **_shuffle_causal(example, gen)}
    perm = real_permutation(example["key_padding_mask"], gen)
    return {**example, "input_ids": example["input_ids"][perm], "labels": example["labels"][perm]}


def _shuffle_causal(example: dict[str, Tensor], gen: torch.Generator) -> dict[str, Tensor]:
    inputs, labels, valid = example["input_ids"], example["labels"], example["key_padding_mask"]
    n = int(valid.sum())
    if not torch.equal(valid, torch.arange(len(valid)) < n):
        raise ValueError("a causal example's real tokens must come first (right padding)")
    # raw text: the n inputs, plus the final target when it is scored (it is no input)
    last = labels[n - 1 : n]
    tail = last if int(last) != IGNORE else last[:0]
    raw = torch.cat([inputs[:n], tail])  # (r,)
    scored = torch.cat([torch.zeros(1, dtype=torch.bool), labels[: len(raw) - 1] != IGNORE])  # (r,) raw[t] scored
    perm = torch.randperm(len(raw), generator=gen)
    raw, scored = raw[perm], scored[perm]
    new_inputs, new_labels = inputs.clone(), torch.full_like(labels, IGNORE)
    new_inputs[:n] = raw[:n]
    new_labels[: len(raw) - 1] = torch.where(scored[1:], raw[1:], IGNORE)
    return {"input_ids": new_inputs, "labels": new_labels}
