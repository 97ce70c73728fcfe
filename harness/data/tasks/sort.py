"""Sort the input string (Ruoss et al. 2023's bucket sort; Kazemnejad et al. 2023's sorting)."""

from __future__ import annotations

from torch import Tensor

from harness.data.tasks.strings import Transduction


class Sort(Transduction):
    """Sort: the output is the input's symbols in ascending order (by byte value: 0 < 1 < … < 9, a < … < z).

    Encoder form: Ruoss et al. 2023's ``bucket_sort`` (a context-sensitive task of their set: the model must
    count how many of each symbol precede the output slot it fills), alphabet of 5 symbols by default as
    their vocab_size=5, output read at |w| empty slots after the input. Causal form: Kazemnejad et al.
    2023's "Sorting" task (Appendix D.1, single-digit numbers: ``Sort the following numbers: 3 1 4 .`` →
    ``1 3 4 .``), instruction words dropped as for ``copy``; alphabet 0–9 by default. A position-blind
    model knows the multiset but not which slot it fills (its baseline is computed, harness/data/tasks/blind.py).
    """

    causal_alphabet, encoder_alphabet = "0123456789", "01234"

    def transform(self, w: Tensor) -> Tensor:
        return w.sort().values
