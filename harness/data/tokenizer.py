"""Tokenizers (conf/tokenizer). Byte-level by default: ids 0–255 are bytes, then specials."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
    """256 byte ids + [PAD] + [MASK]. One token per byte, so nats/token → bits/byte is /ln 2."""

    byte_level = True

    def __init__(self):
        self.pad_id = 256
        self.mask_id = 257
        self.vocab_size = 258
        self.n_regular = 256  # ids a random replacement may draw (BERT's 10 % random tokens)

    def encode(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")
