"""Copy the input string: the identity transduction (Kazemnejad et al. 2023; Ruoss et al. 2023)."""

from __future__ import annotations

from torch import Tensor

from harness.data.tasks.strings import Transduction


class Copy(Transduction):
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

    def transform(self, w: Tensor) -> Tensor:
        return w
