"""String transduction tasks: copy, reverse, missing duplicate.

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


def random_string(alphabet: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """(n,) ids drawn uniformly and independently from ``alphabet``."""
    return alphabet[torch.randint(len(alphabet), (n,), generator=gen)]


class _Transduction(SyntheticTask):
    """Input string w (length = |w|), output f(w), scored by exact match on the output.

    causal:  w | f(w) .   labels on f(w) and the final "." (the model must also stop)
    encoder: w [MASK]×|w|  labels on the |w| slots (Ruoss et al.'s empty output tape; no separator)
    """

    def __init__(self, tokenizer=None, form: str | None = None, alphabet: str | None = None,
                 train_lengths=(1, 20), eval_lengths=(5, 10, 20, 40, 80), eval_examples: int = 128):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        # null: each paper's own alphabet — tokens from the vocabulary (Kazemnejad et al.; a–z here),
        # binary strings (Ruoss et al., vocab_size=2)
        alphabet = (LOWERCASE if self.causal else BINARY) if alphabet is None else alphabet
        self.alphabet = symbols("task.alphabet", alphabet, reserved=SEP + END)

    def transform(self, w: Tensor) -> Tensor:
        raise NotImplementedError

    def layout_size(self, length: int) -> int:
        return 2 * length + 2 if self.causal else 2 * length

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        w = random_string(self.alphabet, length, gen)
        if self.causal:
            tokens = torch.cat([w, ascii_ids(SEP), self.transform(w), ascii_ids(END)])
            n_answer = length + 1
        else:
            tokens, n_answer = torch.cat([w, self.transform(w)]), length
        answer = torch.arange(len(tokens)) >= len(tokens) - n_answer
        return Layout(tokens, answer)


class Copy(_Transduction):
    """Copy: the output is the input string.

    Causal form: Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization
    in Transformers", Appendix D.1 "Copy", third variant (input tokens sampled from the vocabulary,
    reproduced in order): ``Copy the following words: <w1> … <wn> .`` → ``<w1> … <wn>``, decoder-only,
    trained on short instances and tested on longer ones, scored by exact match of the greedy output.
    The constant instruction words are dropped (at byte level they only add tokens); the separator
    "|" and the terminator "." remain. Alphabet a–z by default.

    Encoder form: the input-then-empty-output-slots format of Ruoss et al. 2023, "Randomized
    Positional Encodings Boost Length Generalization of Transformers" (their encoder reads
    [w, empty×|output|] and predicts at the slots), applied to the identity map; binary alphabet
    by default, as their string tasks (vocab_size=2). Their training lengths are uniform 1–40.
    """

    name = "copy"

    def transform(self, w: Tensor) -> Tensor:
        return w


class Reverse(_Transduction):
    """Reverse: the output is the input string reversed.

    Causal form: Kazemnejad et al. 2023, Appendix D.1 "Reverse", first variant (tokens sampled from
    the vocabulary): ``Reverse the following words: <w1> … <wn> .`` → ``<wn> … <w1> .``; instruction
    words dropped as for ``copy``. Encoder form: Ruoss et al. 2023's ``reverse_string`` (binary
    alphabet, output read at |w| empty slots after the input, training lengths uniform 1–40).
    """

    name = "reverse"

    def transform(self, w: Tensor) -> Tensor:
        return w.flip(0)


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

    name = "missing_duplicate"
    forms = ("encoder",)

    def __init__(self, tokenizer=None, form: str | None = None, alphabet: str = BINARY,
                 train_lengths=(1, 20), eval_lengths=(5, 10, 20, 40, 80), eval_examples: int = 128):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        self.alphabet = symbols("task.alphabet", alphabet)

    def form_note(self) -> str:
        return " (the blank sits inside the second copy; Ruoss et al. pose it to a bidirectional encoder)"

    def layout_size(self, length: int) -> int:
        return 2 * length

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        w = random_string(self.alphabet, length, gen)
        blank = int(torch.randint(2 * length, (1,), generator=gen))
        answer = torch.arange(2 * length) == blank
        return Layout(torch.cat([w, w]), answer, {"blank": blank})
