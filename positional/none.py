"""No positional information (NoPE).

For bidirectional MLM the model is permutation-equivariant and cannot use order; for
causal LM the mask alone leaks position (Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers").
"""

from positional.base import PositionalScheme


class NoPosition(PositionalScheme):
    """All three hooks stay no-ops."""

    randomize_refusal = "pos=none reads no positions, so there is nothing to randomize"
