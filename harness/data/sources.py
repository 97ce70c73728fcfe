"""What the harness calls on a corpus source (``data.source``) and on a tokenizer (``tokenizer``): the two
interfaces a user's own class implements to be a ``data=`` or ``tokenizer=`` option.

A source may also offer, and the checks ask for it by name: ``document_starts()`` (packed documents:
``model.restart_positions``, ``model.document_mask``) and ``check_tokenizer(tokenizer, name)`` (pre-tokenized
shards, which hold one tokenizer's ids).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from torch import Tensor

from harness.data.corpus import Corpus


class Source(Protocol):
    """A corpus: its split sizes known before it is read (bytes, or a shard folder's token ids), then the text."""

    def sizes(self) -> tuple[int, int]:
        """(training, validation) size, without reading the corpus."""

    def load(self) -> Corpus:  # a TokenCorpus for pre-tokenized shards
        ...


class Tokenizer(Protocol):
    """Bytes to ids; a subword vocabulary is fitted on the training split (``fit``) before the first ``encode``."""

    vocab_size: int
    pad_id: int
    mask_id: int | None
    byte_level: bool  # one id per byte: token counts are byte counts before anything is read

    @classmethod
    def config_name(cls) -> str: ...

    def fit(self, corpus: Corpus) -> None: ...

    def encode(self, data: bytes) -> np.ndarray: ...

    def decode(self, ids: object) -> str: ...

    def digest(self) -> str: ...

    def regular_ids(self) -> Tensor:  # masked LM only (as word_continues): what its random replacement draws
        ...

    def word_continues(self, ids: Tensor) -> Tensor:  # (T,) bool: token t continues t − 1's word (whole-word masking)
        ...
