"""Tokenizers (conf/tokenizer). Byte-level by default: ids 0–255 are bytes, then specials. The subword ones
(bpe, wordpiece, hf) are in harness/data/subword.py and offer the same methods."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from harness import integrity
from harness.data.subword import byte_alphabet, continues_word, line_chunks, word_byte


class ByteTokenizer:
    """256 byte ids + [PAD] + [MASK]. One token per byte, so nats/token → bits/byte is /ln 2."""

    byte_level = True
    special_tokens = ("<|pad|>", "<|mask|>")  # ids 256 and 257, as an exported tokenizer.json names them

    def __init__(self):
        self.pad_id, self.mask_id, self.vocab_size = 256, 257, 258
        words = torch.tensor([word_byte(b) for b in range(256)] + [False, False])
        self._word_tables = (words, words)  # a byte continues a word when it and the one before are word bytes

    @classmethod
    def config_name(cls) -> str:
        return "byte"

    def fit(self, corpus) -> None:
        """Nothing to learn."""

    def encode(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, dtype=np.uint8)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def regular_ids(self) -> Tensor:
        """The ids a random replacement may draw (BERT's 10 % random tokens): the bytes."""
        return torch.arange(256)

    def word_continues(self, ids: Tensor) -> Tensor:
        """(T,) bool: byte t continues the word of byte t − 1 (both letters, digits, '_' or non-ASCII)."""
        return continues_word(ids, *self._word_tables)

    def digest(self) -> str:
        return integrity.sha256(b"posbench byte tokenizer: ids 0-255 bytes, 256 [PAD], 257 [MASK]")

    @property
    def tokenizer(self):
        """The same ids as a ``tokenizers.Tokenizer`` (what an export writes as tokenizer.json): GPT-2's byte-level
        alphabet, each byte its own id, no merges, the whole text one piece; then the two specials."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        tok = Tokenizer(models.BPE(vocab=dict(byte_alphabet()), merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True) for t in self.special_tokens])
        return tok


def bytes_per_token(corpus, tokenizer, tokens: int | None = None) -> float:
    """Bytes of validation text per token (1 for the byte tokenizer): bits/byte = nats/token ÷ (this × ln 2)
    is then comparable across vocabularies. ``tokens``: of the split's first this many tokens only, those the
    validation scores under data.eval_batches (None: the whole split). Pre-tokenized shards carry the whole
    split's in their manifest."""
    known = getattr(corpus, "val_bytes_per_token", None)
    if known is not None:
        return known
    n = len(tokenizer.encode(corpus.val))
    if tokenizer.byte_level or tokens is None or tokens >= n:
        return len(corpus.val) / max(1, n)
    return _prefix_bytes(corpus.val, tokenizer.tokenizer, tokens) / tokens


def _prefix_bytes(data: bytes, backend, tokens: int) -> int:
    """Bytes of ``data`` before its token number ``tokens``, read from the ``tokenizers`` offsets (characters of
    each chunk ``Subword.encode`` encodes)."""
    done = covered = 0
    for chunk in line_chunks(data.decode("utf-8", errors="replace")):
        offsets = backend.encode(chunk, add_special_tokens=False).offsets
        if tokens < done + len(offsets):
            return covered + len(chunk[: offsets[tokens - done][0]].encode())
        done, covered = done + len(offsets), covered + len(chunk.encode())
    return covered


def document_firsts(corpus, split: str) -> np.ndarray | None:
    """True at the first token of each document of ``split`` (the corpus's ``starts``, byte offsets, which are token
    indices for the byte tokenizer: validation refuses documents with another), or None when the corpus carries
    none."""
    if getattr(corpus, "starts", None) is None:
        return None
    offsets = corpus.starts[0 if split == "train" else 1]
    firsts = np.zeros(len(getattr(corpus, split)), dtype=bool)
    firsts[offsets[offsets < len(firsts)]] = True
    return firsts


def split_ids(corpus, tokenizer, split: str):
    """The token ids of ``split`` ("train" or "val"): pre-tokenized shards' own (harness/data/shards.py), else
    the tokenizer's encoding of the text."""
    if hasattr(corpus, "ids"):
        return corpus.ids(split)
    return tokenizer.encode(getattr(corpus, split))
