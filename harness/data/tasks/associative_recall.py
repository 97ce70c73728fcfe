"""Multi-query associative recall (MQAR): the control task of the suite."""

from __future__ import annotations

import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask, ascii_ids, symbols
from harness.errors import ConfigError

KEYS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VALUES = "0123456789"
SEP = "|"


class AssociativeRecall(SyntheticTask):
    """MQAR of Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
    Models" (their generator ``multiquery_ar``): n key–value pairs, then every key queried once; the model must
    emit each queried key's value. Decoder-only (causal), as in Zoology. Length = n pairs.

    Layout: ``k1 v1 k2 v2 … kn vn | q1 a1 q2 a2 … qn an`` where (q1 … qn) is a random permutation of
    the keys and a_i their values; only the a_i are scored (exact match over all n). Keys are n
    distinct symbols of ``task.keys`` (Zoology: each key present once); values are drawn from
    ``task.values`` with replacement (Zoology draws them without replacement from a vocabulary half
    of ~4k tokens; with one printable byte per value there are too few). Differences kept small and
    stated: queries follow the "|" back to back instead of at Zoology's power-law gaps among random
    filler tokens, and each query's answer is a teacher-forced input like any causal target.

    Why a control: retrieving v by matching k is content addressing. A causal model locates "the
    token after my earlier occurrence" without any positional encoding, so positional schemes
    should tie here, while attention variants separate: a fixed-size state (linear attention,
    Performer) must compress all n pairs and exact softmax attention need not — Zoology's argument
    against gated convolutions, which Arora et al. 2024 ("Based") make for linear attention.
    """

    forms = ("causal",)

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        keys: str = KEYS,
        values: str = VALUES,
        train_lengths=(1, 8),
        eval_lengths=(4, 8, 16, 32),
        eval_examples: int = 128,
    ):
        self.keys = symbols("task.keys", keys, reserved=SEP)
        self.values = symbols("task.values", values, reserved=SEP)
        shared = sorted(set(keys) & set(values))
        if shared:
            raise ConfigError(
                f"task.keys and task.values share {''.join(shared)!r}; keep them disjoint, so a "
                "value never reads as a key"
            )
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)

    form_note = (
        " (a bidirectional model without positions sees a bag of tokens and could not pair keys with "
        "values, so MQAR would stop being the positional control Zoology makes it)"
    )
    max_length_reason = "each pair needs a distinct key; give a longer task.keys"

    def max_length(self) -> int:
        return len(self.keys)

    def layout_size(self, length: int) -> int:
        return 4 * length + 1

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        keys = self.keys[torch.randperm(len(self.keys), generator=gen)[:length]]  # (n,) distinct
        values = self.values[torch.randint(len(self.values), (length,), generator=gen)]  # (n,)
        order = torch.randperm(length, generator=gen)
        context = torch.stack([keys, values], dim=1).flatten()  # (2n,) k1 v1 k2 v2 …
        queries = torch.stack([keys[order], values[order]], dim=1).flatten()  # (2n,) q1 a1 q2 a2 …
        tokens = torch.cat([context, ascii_ids(SEP), queries])
        answer = torch.zeros(len(tokens), dtype=torch.bool)
        answer[2 * length + 2 :: 2] = True  # the a_i: every other token after "|", starting at a1
        return Layout(tokens, answer)
