"""Subword tokenizers (conf/tokenizer bpe, wordpiece, hf), each a ``tokenizers.Tokenizer`` underneath.

- ``BPE``: byte-level BPE (GPT-2's: every byte is in the alphabet, so no text is unknown), trained with the
  ``tokenizers`` library on the corpus's training split to ``tokenizer.vocab_size`` ids;
- ``WordPiece``: BERT's (lower-cased, accents stripped, split at whitespace and punctuation, ``##``
  continuations), trained the same way;
- ``Pretrained``: a Hugging Face tokenizer by name (``gpt2``, ``bert-base-uncased``) or from a local folder
  (``save_pretrained``), through ``transformers.AutoTokenizer`` (a fast tokenizer: its ``tokenizers`` core).

A trained vocabulary is cached under ``$POSBENCH_CACHE/tokenizers``, keyed by the training split's sha256 and
the settings, so a second run on the same corpus loads it instead of training; ``tokenizer.path=…/tokenizer.json``
loads a saved one instead of training. Trained vocabularies start with the specials [PAD] [UNK] [CLS] [SEP]
[MASK] (ids 0–4), so their ids are known before training.

What the rest of the harness reads (as on ``ByteTokenizer``): ``vocab_size``, ``pad_id``, ``mask_id`` (None
when the vocabulary has no mask token: masked LM is refused), ``encode(bytes)``, ``decode(ids)``,
``regular_ids()`` (what BERT's 10 % random replacement draws from: every id but the specials),
``word_continues(ids)`` (whole-word masking) and ``digest()`` (identifies the vocabulary: pre-tokenized
shards record it). ``fit(corpus)`` trains or loads before the first ``encode``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, AnyStr

import numpy as np
import torch
from torch import Tensor

from harness import integrity
from harness.data import corpus as corpus_module
from harness.data.hf import hub_offline
from harness.errors import ConfigError, one_line
from harness.ranges import Range, ranged

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0–4 of a trained vocabulary
DEFAULT_VOCAB = 8192
VocabSize = Annotated[
    int,
    Range(
        f"at least {len(SPECIALS) + 256} (the specials and the byte alphabet), "
        f"e.g. tokenizer.vocab_size={DEFAULT_VOCAB}",
        ge=len(SPECIALS) + 256,
        le=2**32 - 1,
    ),
]
CHUNK = 1 << 16  # characters encoded at a time (cut at line ends): a long text is one batch, not one sequence


def word_byte(b: int) -> bool:
    """A byte that is part of a word: ASCII letters, digits, '_', or any byte of a multi-byte UTF-8 character."""
    return b >= 0x80 or chr(b).isalnum() or b == ord("_")


def continues_word(ids: Tensor, starts_inside: Tensor, ends_inside: Tensor) -> Tensor:
    """(T,) bool: token t continues the word token t − 1 is in. ``starts_inside[id]``: the token begins
    inside a word (a word byte, or a ``##`` continuation); ``ends_inside[id]``: it ends inside one."""
    out = starts_inside[ids].clone()
    out[1:] &= ends_inside[ids[:-1]]
    out[:1] = False
    return out


def stream_chunks(pieces: Iterable[str], size: int = CHUNK) -> Iterator[str]:
    """``line_chunks`` of the pieces' join, yielded as the pieces arrive: the same chunks, with at most one chunk
    and one piece held (a vocabulary trained from a stream sees what the in-memory training sees)."""
    carry = ""
    for piece in pieces:
        carry += piece
        while (end := carry.find("\n", size)) >= 0:
            yield carry[: end + 1]
            carry = carry[end + 1 :]
    if carry:
        yield carry


def line_chunks(data: AnyStr, size: int = CHUNK) -> Iterator[AnyStr]:
    """``data`` (text or bytes) in pieces of about ``size`` characters (bytes), each ending at a line end (or at
    ``data``'s end)."""
    newline = "\n" if isinstance(data, str) else b"\n"
    start = 0
    while start < len(data):
        end = data.find(newline, start + size)
        end = len(data) if end < 0 else end + 1
        yield data[start:end]
        start = end


class Subword:
    """A ``tokenizers.Tokenizer`` as the harness's tokenizer (see the module docstring)."""

    byte_level = False
    vocab_size: int  # ids in the vocabulary, specials included: each kind sets it

    def __init__(self):
        self._tok = None  # tokenizers.Tokenizer, once fitted or loaded
        self._encoded: dict[bytes, np.ndarray] = {}  # the splits already encoded (train, val)

    # --- what the harness calls

    def fit(self, corpus) -> None:
        """Ready to encode ``corpus`` (trained tokenizers train or load here; loaded ones need nothing)."""

    @property
    def tokenizer(self):
        if self._tok is None:
            raise RuntimeError(f"{type(self).__name__}: call fit(corpus) before encoding (train.py does)")
        return self._tok

    def encode(self, data: bytes) -> np.ndarray:
        """Token ids of UTF-8 text, uint16 when the vocabulary allows, else uint32 (as prepared shards)."""
        if data not in self._encoded:
            if len(self._encoded) >= 2:
                self._encoded.clear()
            chunks = list(line_chunks(data.decode("utf-8", errors="replace")))
            dtype = np.uint16 if self.vocab_size < 65536 else np.uint32
            self._encoded[data] = np.concatenate(
                [np.asarray(e.ids, dtype=dtype) for e in self.tokenizer.encode_batch(chunks, add_special_tokens=False)]
                or [np.empty(0, dtype)]
            )
        return self._encoded[data]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def digest(self) -> str:
        """sha256 of the vocabulary and its pipeline (the tokenizer's JSON)."""
        return integrity.sha256(self.tokenizer.to_str())

    @property
    def special_ids(self) -> list[int]:
        return sorted(i for t in self.special_tokens if (i := self.tokenizer.token_to_id(t)) is not None)

    special_tokens: tuple[str, ...] = SPECIALS

    def regular_ids(self) -> Tensor:
        """The ids a random replacement draws from: every id of the vocabulary but the specials."""
        keep = torch.ones(self.tokenizer.get_vocab_size(with_added_tokens=True), dtype=torch.bool)
        keep[self.special_ids] = False
        return keep.nonzero().squeeze(1)

    def word_continues(self, ids: Tensor) -> Tensor:
        """(T,) bool: token t continues the word of token t − 1 (whole-word masking)."""
        return continues_word(ids, *self._word_tables)

    @functools.cached_property
    def _word_tables(self) -> tuple[Tensor, Tensor]:
        """(starts_inside, ends_inside) per id, read from each token's surface form."""
        tok, n = self.tokenizer, self.vocab_size
        starts, ends = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
        specials = set(self.special_ids)
        pipeline = json.loads(tok.to_str())
        model = pipeline["model"]
        prefix = model.get("continuing_subword_prefix", "##") if model["type"] == "WordPiece" else None
        byte_level = any("ByteLevel" in json.dumps(pipeline.get(part)) for part in ("pre_tokenizer", "decoder"))
        for token, i in tok.get_vocab(with_added_tokens=True).items():
            if i >= n or i in specials:
                continue
            if prefix is not None:  # WordPiece: a continuation says so; pre-tokenization split everything else
                starts[i], ends[i] = token.startswith(prefix), True
            else:
                surface = _surface(token, byte_level)
                if surface:
                    starts[i], ends[i] = word_byte(surface[0]), word_byte(surface[-1])
        return starts, ends


@functools.cache
def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in of each byte (the ByteLevel pre-tokenizer's alphabet) → the byte: a printable
    byte stands for itself, the others in order for 256, 257, …"""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in keep]
    return {chr(b) if b in keep else chr(256 + others.index(b)): b for b in range(256)}


def _surface(token: str, byte_level: bool) -> bytes:
    """The bytes a vocabulary entry stands for: byte-level tokens through GPT-2's byte map, SentencePiece's
    ▁ as a space, others as written."""
    decoder = byte_alphabet()
    if byte_level and all(c in decoder for c in token):
        return bytes(decoder[c] for c in token)
    return token.replace("▁", " ").encode("utf-8")


# --------------------------------------------------------------------------- trained on the corpus


class Trained(Subword):
    """Trained on the training split by the ``tokenizers`` library (or loaded from ``path``)."""

    kind: str
    requires = ("tokenizers",)  # checked before it is built (harness/extras.py): the hf extra brings it

    @ranged
    def __init__(
        self,
        vocab_size: VocabSize | None = None,
        path: str | None = None,
        min_frequency: Annotated[int, Range("≥ 1", ge=1)] = 2,
        train_bytes: Annotated[int, Range("a whole number ≥ 4096, or null for the whole training split", ge=4096)]
        | None = None,
    ):
        """``train_bytes``: train on the training split's first this many bytes (a bounded sample of a large
        corpus; None: all of it)."""
        super().__init__()
        if train_bytes is not None and path:
            raise ConfigError(
                "tokenizer.train_bytes sizes the sample a vocabulary is trained on; tokenizer.path "
                "loads a trained one: drop one of them"
            )
        self.min_frequency, self.train_bytes = min_frequency, train_bytes
        if path:
            self._tok = load_file(path)
            self._tok.encode_special_tokens = True  # as trained ones (_trained)
            self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
            if vocab_size is not None and vocab_size != self.vocab_size:
                raise ConfigError(
                    f"tokenizer.vocab_size={vocab_size} but tokenizer.path={path} holds {self.vocab_size} ids; "
                    "drop tokenizer.vocab_size (the file decides) or train one without tokenizer.path"
                )
            self.pad_id, self.mask_id = (
                _special_id(self._tok, ("[PAD]", "<pad>")),
                _special_id(self._tok, ("[MASK]", "<mask>")),
            )
            if self.pad_id is None:
                raise ConfigError(f"tokenizer.path={path} has no [PAD] or <pad> token; add one to it")
            self.special_tokens = tuple(
                t["content"] for t in json.loads(self._tok.to_str())["added_tokens"] if t.get("special")
            )
        else:
            self.vocab_size = vocab_size or DEFAULT_VOCAB
            self.pad_id, self.mask_id = SPECIALS.index("[PAD]"), SPECIALS.index("[MASK]")
        self.asked = self.vocab_size  # tokenizer.vocab_size: what the recipe and cache name (a fit may give fewer)

    @classmethod
    def config_name(cls) -> str:
        return cls.kind

    def fit(self, corpus) -> None:
        if self._tok is not None:
            return
        fitted = getattr(corpus, "fitted_tokenizer", None)
        if fitted is not None:  # pre-tokenized shards: the vocabulary they were written with (prepare.py)
            self._tok = fitted(self)
        else:
            sample = corpus.train[: self.train_bytes]  # None: all of it
            # named by the settings and the sample's sha256; CACHE read at call time (tests point it elsewhere)
            cache = (
                corpus_module.CACHE
                / "tokenizers"
                / f"{self.kind}-v{self.asked}-f{self.min_frequency}-{integrity.sha256(sample)[:20]}.json"
            )
            # a damaged or swapped file would change every id of the run: refused; an unsealed one is trained again
            # (until its seal is there, as while another run writes it); the bytes are those Tokenizer.save writes
            trained = integrity.cached(
                cache,
                lambda: (
                    train_tokenizer(self.kind, sample, self.vocab_size, self.min_frequency)
                    .to_str(pretty=True)
                    .encode("utf-8")
                ),
                "the cached vocabulary was damaged or replaced; delete it and the run trains it again",
            )
            self._tok = load_file(str(trained))
        self._trained()

    def fit_stream(self, texts: Iterable[str]) -> None:
        """Train on the training split's text as it streams (``prepare`` of a streamed corpus): ``texts`` in order,
        cut by the caller at ``train_bytes``; the same vocabulary ``fit`` trains on their join, without holding it."""
        if self._tok is None:
            self._tok = train_tokenizer(self.kind, stream_chunks(texts), self.vocab_size, self.min_frequency)
            self._trained()

    def _trained(self) -> None:
        """A text too small for every merge asked gives fewer ids: the model gets the vocabulary's own size (no rows
        for ids that never occur), and the run says so (harness/train.py). More than asked (WordPiece's trainer keeps
        every character of the text, and its ## form, whatever the size) would index past the model's rows: refused."""
        assert self._tok is not None, "called once the vocabulary is trained or loaded"
        # "[MASK]" written in the corpus is text: read as the mask id it would be a position masked LM never chose
        self._tok.encode_special_tokens = True
        trained = self._tok.get_vocab_size(with_added_tokens=True)
        if trained > self.asked:
            raise ConfigError(
                f"tokenizer={self.kind} trained {trained:,} ids, more than tokenizer.vocab_size={self.asked:,}: the "
                "training split's characters (each also as a ## continuation) and the specials alone take that many; "
                f"raise tokenizer.vocab_size to at least {trained:,}"
            )
        self.vocab_size = trained

    def recipe(self) -> dict:
        """What decides a trained vocabulary besides the text (pre-tokenized shards record it)."""
        sample = {"train_bytes": self.train_bytes} if self.train_bytes is not None else {}
        return {"kind": self.kind, "vocab_size": self.asked, "min_frequency": self.min_frequency, **sample}


class BPE(Trained):
    """Byte-level BPE (Sennrich et al. 2016 with GPT-2's byte alphabet), trained on the training split."""

    kind = "bpe"


class WordPiece(Trained):
    """BERT's WordPiece (Wu et al. 2016; Devlin et al. 2019): lower-cased, ``##`` continuations."""

    kind = "wordpiece"


def train_tokenizer(kind: str, train: bytes | Iterator[str], vocab_size: int, min_frequency: int):
    """A ``tokenizers.Tokenizer`` trained on ``train`` (UTF-8 bytes, or its ``line_chunks`` as they stream), the
    specials first."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer: trainers.Trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
        )
    chunks = line_chunks(train.decode("utf-8", errors="replace")) if isinstance(train, bytes) else train
    tok.train_from_iterator(chunks, trainer)
    if kind == "wordpiece":  # its trainer numbers the same tokens in another order run to run: fix one order
        vocab = tok.get_vocab()
        order = sorted(vocab, key=lambda t: (vocab[t], "") if vocab[t] < len(SPECIALS) else (len(SPECIALS), t))
        tok.model = models.WordPiece({t: i for i, t in enumerate(order)}, unk_token="[UNK]")
    return tok


def load_file(path: str):
    from tokenizers import Tokenizer

    file = Path(path).expanduser()
    if file.is_dir() and (file / "tokenizer.json").is_file():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(
            f"tokenizer.path={path} does not exist; point it at a tokenizer.json (or drop it to train "
            "one on the corpus)"
        )
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:
        raise ConfigError(
            f"tokenizer.path={path} is not a tokenizers JSON file ({one_line(e)[:200]}); "
            "point it at the tokenizer.json a tokenizer saved"
        ) from None


def _special_id(tok, names: tuple[str, ...]) -> int | None:
    return next((i for name in names if (i := tok.token_to_id(name)) is not None), None)


# --------------------------------------------------------------------------- Hugging Face, by name


class Pretrained(Subword):
    """A Hugging Face tokenizer: ``tokenizer.name=gpt2``, ``bert-base-uncased`` or a ``save_pretrained`` folder."""

    requires = ("transformers", "tokenizers")

    def __init__(self, name: str | None = None):
        super().__init__()
        if not name:
            raise ConfigError(
                "tokenizer=hf needs tokenizer.name=gpt2, bert-base-uncased or a folder a tokenizer "
                "was saved to (save_pretrained)"
            )
        local = Path(name).expanduser().exists()
        offline = None if local else hub_offline()  # asked before transformers is imported: it reads the setting then
        from transformers import AutoTokenizer  # declared in requires: checked before this class is built

        try:
            hf = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as e:
            why = (
                f"cannot load a tokenizer from this folder ({one_line(e)[:160]})"
                if local
                else f"not in the Hugging Face cache, and the Hub was not asked ({offline})"
                if offline
                else "not in the Hugging Face cache and the Hub cannot be reached"
            )
            save = f"AutoTokenizer.from_pretrained('{name}').save_pretrained('DIR')"
            raise ConfigError(
                f'tokenizer.name={name}: {why}; where there is a network run python -c "from '
                f'transformers import AutoTokenizer; {save}" and set tokenizer.name=DIR'
            ) from None
        if not getattr(hf, "is_fast", False):
            raise ConfigError(f"tokenizer.name={name} has no fast (tokenizers) version; use one that does")
        self._tok = hf.backend_tokenizer
        self.vocab_size = len(hf)
        self.mask_id = hf.mask_token_id
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id
        if self.pad_id is None:
            raise ConfigError(f"tokenizer.name={name} has neither a pad nor an end-of-text token to pad windows with")
        # the named ones, and those its tokenizer marks special without naming them to transformers
        added = (t.content for t in hf.added_tokens_decoder.values() if t.special)
        self.special_tokens = tuple(dict.fromkeys([*hf.all_special_tokens, *added]))

    @classmethod
    def config_name(cls) -> str:
        return "hf"
