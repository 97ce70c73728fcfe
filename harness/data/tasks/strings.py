"""What the string tasks share: their alphabets and the transduction layout of copy.py, reverse.py and sort.py.

Alphabets are printable ASCII bytes, so the byte tokenizer (vocab 258) serves them unchanged;
[MASK] (id 257) marks the encoder form's empty output slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask, ascii_ids, symbols

LOWERCASE = "abcdefghijklmnopqrstuvwxyz"
BINARY = "01"
SEP, END = "|", "."  # causal form: w SEP output END


class Transduction(SyntheticTask):
    """Input string w (length = |w|), output f(w), scored by exact match on the output.

    causal:  w | f(w) .   labels on f(w) and the final "." (the model must also stop)
    encoder: w [MASK]×|w|  labels on the |w| slots (Ruoss et al.'s empty output tape; no separator)
    """

    # task.alphabet=null: each paper's own — tokens from the vocabulary (Kazemnejad et al.; a–z here),
    # binary strings (Ruoss et al., vocab_size=2); a task may name others
    causal_alphabet, encoder_alphabet = LOWERCASE, BINARY

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        alphabet: str | None = None,
        train_lengths=(1, 20),
        eval_lengths=(5, 10, 20, 40, 80),
        eval_examples: int = 128,
    ):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        alphabet = (self.causal_alphabet if self.causal else self.encoder_alphabet) if alphabet is None else alphabet
        self.alphabet = symbols("task.alphabet", alphabet, reserved=SEP + END)

    def transform(self, w: Tensor) -> Tensor:
        raise NotImplementedError

    def layout_size(self, length: int) -> int:
        return 2 * length + 2 if self.causal else 2 * length

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        w = self.alphabet[torch.randint(len(self.alphabet), (length,), generator=gen)]  # (|w|,) uniform, independent
        if self.causal:
            tokens, n_answer = torch.cat([w, ascii_ids(SEP), self.transform(w), ascii_ids(END)]), length + 1
        else:
            tokens, n_answer = torch.cat([w, self.transform(w)]), length
        return Layout(tokens, torch.arange(len(tokens)) >= len(tokens) - n_answer)
