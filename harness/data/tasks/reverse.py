"""Reverse the input string (Kazemnejad et al. 2023; Ruoss et al. 2023)."""

from __future__ import annotations

from torch import Tensor

from harness.data.tasks.strings import Transduction


class Reverse(Transduction):
    """Reverse: the output is the input string reversed.

    Causal form: Kazemnejad et al. 2023, Appendix D.1 "Reverse", first variant (tokens sampled from
    the vocabulary): ``Reverse the following words: <w1> … <wn> .`` → ``<wn> … <w1> .``; instruction
    words dropped as for ``copy``. Encoder form: Ruoss et al. 2023's ``reverse_string`` (binary
    alphabet, output read at |w| empty slots after the input, training lengths uniform 1–40).
    """

    def transform(self, w: Tensor) -> Tensor:
        return w.flip(0)
