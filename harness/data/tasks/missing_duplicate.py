"""Missing duplicate: ``w w`` with one token blanked, predicted in place (Ruoss et al. 2023)."""

from __future__ import annotations

import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask, symbols
from harness.data.tasks.strings import BINARY


class MissingDuplicate(SyntheticTask):
    """Missing duplicate: ``w w`` with one token blanked; predict the blank (length = |w|).

    Ruoss et al. 2023, task ``missing_duplicate_string`` (from Delétang et al. 2023, "Neural Networks
    and the Chomsky Hierarchy"): a binary string presented twice, one element replaced by a
    placeholder, the blanked index uniform over both copies. Bidirectional (encoder) only. Two
    deliberate differences: the answer is read at the blank itself (a [MASK] input scored in place,
    as masked LM) rather than at an output slot appended after the input, so solving it needs
    attention at offset exactly ±|w|; and length counts |w| (theirs counts |ww|, padding odd ones).
    The example's ``blank`` field is the blanked index.
    """

    forms = ("encoder",)

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        alphabet: str = BINARY,
        train_lengths=(1, 20),
        eval_lengths=(5, 10, 20, 40, 80),
        eval_examples: int = 128,
    ):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        self.alphabet = symbols("task.alphabet", alphabet)

    form_note = " (the blank sits inside the second copy; Ruoss et al. pose it to a bidirectional encoder)"

    def layout_size(self, length: int) -> int:
        return 2 * length

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        w = self.alphabet[torch.randint(len(self.alphabet), (length,), generator=gen)]  # (|w|,) uniform, independent
        blank = int(torch.randint(2 * length, (1,), generator=gen))
        return Layout(torch.cat([w, w]), torch.arange(2 * length) == blank, {"blank": blank})
