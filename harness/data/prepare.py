"""Tokenize a corpus once into memory-mapped shards: ``posbench prepare DIR [overrides]`` (harness/main.py loads the
overrides, as for a run, and hands the data source and the tokenizer here).

    posbench prepare ~/tok/wiki data=hf data.path=~/wiki tokenizer=bpe tokenizer.vocab_size=16384
    posbench run data=tokens data.path=~/tok/wiki tokenizer=bpe tokenizer.vocab_size=16384 task=clm

A trained vocabulary is trained on the training split, or loaded from its cache. DIR receives the shards,
``manifest.json`` and, for a subword vocabulary, ``tokenizer.json`` (harness/data/shards.py describes the
format). Text is encoded in pieces of about ``PIECE`` bytes cut at line ends, so memory stays bounded by a
piece's ids, not the corpus's.

``data=hf data.streaming=true`` streams rows without holding the corpus: each row goes whole to its side as it
passes (every ``val_every``-th to validation, ``data.val_by=document``) or the 4 KiB blocks of the joined rows do
(``data.val_by=block``, as ``block_split``), cut by ``HFDataset.sides`` as a run in memory cuts them, so a corpus
larger than memory is prepared. A vocabulary to train (tokenizer=bpe, wordpiece) is trained in a first pass
over the stream from the training blocks' text as it passes (the same vocabulary as in memory), then the second pass
encodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from harness import integrity
from harness.data.objectives import Source, Tokenizer
from harness.data.shards import BLOCK_BYTES, FORMAT, block_digest, token_dtype
from harness.data.subword import line_chunks
from harness.errors import ConfigError

PIECE = 1 << 24  # bytes of text encoded at a time
SHARD_TOKENS = 1 << 28  # tokens per shard file (512 MiB of uint16)


class ShardWriter:
    """Appends token ids to ``<split>-NNNNN.bin`` files of at most ``shard_tokens`` ids each."""

    def __init__(
        self,
        folder: Path,
        split: str,
        dtype: np.dtype,
        shard_tokens: int = SHARD_TOKENS,
        block_bytes: int = BLOCK_BYTES,
    ):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.block_bytes = block_bytes
        self.shards: list[dict] = []
        self.bytes = 0
        self._file: BinaryIO | None = None  # the open shard

    def write(self, ids: np.ndarray, n_bytes: int = 0) -> None:
        self.bytes += n_bytes
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        while len(ids):
            if self._file is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._file = self._open()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            head, ids = ids[:room], ids[room:]
            self._file.write(head.tobytes())
            self.shards[-1]["tokens"] += len(head)

    def _open(self) -> BinaryIO:
        """The next shard's file, the one before sealed."""
        self._seal()
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self.shards.append({"file": name, "tokens": 0})
        return open(self.folder / name, "wb")  # noqa: SIM115 (closed by close() or the next shard)

    def _seal(self) -> None:
        """Close the open shard and record its sha256 and its blocks' digests (checked before use:
        harness/data/shards.py), read back from the file just written (still in the page cache, so cheap next to
        tokenizing it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            whole, blocks = hashlib.sha256(), []
            with open(self.folder / self.shards[-1]["file"], "rb") as f:
                while block := f.read(self.block_bytes):
                    whole.update(block)
                    blocks.append(block_digest(hashlib.sha256(block)))
            self.shards[-1]["sha256"], self.shards[-1]["blocks"] = whole.hexdigest(), blocks

    def close(self) -> dict:
        if not self.shards:  # an empty split still has its (empty) shard
            self._file = self._open()
        self._seal()
        return {"tokens": sum(s["tokens"] for s in self.shards), "bytes": self.bytes, "shards": self.shards}


def _out_folder(out: str | Path) -> Path:
    """DIR, absolute, checked before the corpus is read: a name, under a folder (not a file) this user can write."""
    if not str(out).strip():
        raise ConfigError("DIR '' names no folder; give one, e.g. posbench prepare shards/ data=...")
    folder = Path(out).expanduser().absolute()
    integrity.check_writable_dir(folder, "DIR", "choose another DIR")  # a probe written, as the shards will be
    return folder


def prepare(
    out: str | Path,
    source: Source,
    tokenizer: Tokenizer,
    shard_tokens: int = SHARD_TOKENS,
    block_bytes: int = BLOCK_BYTES,
) -> dict:
    """Write the shards and the manifest of ``source`` tokenized by ``tokenizer``; returns the manifest."""
    if hasattr(source, "check_tokenizer"):
        raise ConfigError("data=tokens is token ids already; prepare reads text: pick data=embedded, text, enwik8, hf")
    folder = _out_folder(out)
    if (folder / "manifest.json").exists():
        raise ConfigError(f"{folder} already holds prepared shards (manifest.json); remove it or choose another DIR")
    streaming = getattr(source, "streaming", False)
    corpus = None if streaming else source.load()  # its checks before anything is written
    _check_shard_count(shard_tokens, None if corpus is None else corpus.size)
    existed = folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {folder} ({e.strerror}); choose a folder you can write") from None
    dtype = token_dtype(tokenizer.vocab_size)
    writers = {split: ShardWriter(folder, split, dtype, shard_tokens, block_bytes) for split in ("train", "val")}
    try:
        return _write(folder, source, corpus, tokenizer, writers, dtype, streaming)
    except BaseException:  # a full disk, Ctrl-C, SIGTERM, a bad row: nothing half-written is left behind
        _remove_partial(folder, writers, existed)
        raise


def _write(folder: Path, source, corpus, tokenizer, writers: dict[str, ShardWriter], dtype, streaming: bool) -> dict:
    if streaming:
        corpus_meta = _stream(source, tokenizer, writers)
    else:
        tokenizer.fit(corpus)
        for split in ("train", "val"):
            for piece in line_chunks(getattr(corpus, split), PIECE):
                writers[split].write(tokenizer.encode(piece), len(piece))
        corpus_meta = {
            "name": corpus.name,
            "sha256": corpus.sha256,
            "bytes": corpus.size,
            "train_sha256": hashlib.sha256(corpus.train).hexdigest(),
        }
    splits = {split: writer.close() for split, writer in writers.items()}
    core = getattr(tokenizer, "_tok", None)
    saved = {}
    if core is not None:
        core.save(str(folder / "tokenizer.json"))
        saved = {"file_sha256": integrity.file_digest(folder / "tokenizer.json")}  # checked before it is parsed
    manifest = {
        "format": FORMAT,
        "corpus": corpus_meta,
        "tokenizer": {
            "config": type(tokenizer).config_name(),
            "digest": tokenizer.digest(),
            "vocab_size": tokenizer.vocab_size,
            "recipe": tokenizer.recipe() if hasattr(tokenizer, "recipe") else None,
            **saved,
        },
        "dtype": dtype.name,
        "block_bytes": writers["train"].block_bytes,
        "splits": splits,
    }
    integrity.write(folder / "manifest.json", manifest)  # sealed, as each shard is; written last: a folder with a
    return manifest  # manifest is whole


MAX_SHARDS = 1_000  # shard files a prepare may write: more is a typo of --shard-tokens, not a corpus
STREAMED_SHARD_TOKENS = 1 << 16  # the least --shard-tokens when the corpus's size is not known up front


def _check_shard_count(shard_tokens: int, text_bytes: int | None) -> None:
    """At most ``MAX_SHARDS`` files: a text's tokens are at most its bytes (a token covers a byte or more), so a
    corpus of known size bounds the count before anything is tokenized; a stream's size is not known."""
    if text_bytes is None:
        if shard_tokens < STREAMED_SHARD_TOKENS:
            raise ConfigError(
                f"--shard-tokens={shard_tokens:,} with a streamed corpus (whose size is unknown up "
                f"front) could write a file every {shard_tokens:,} ids; give at least "
                f"{STREAMED_SHARD_TOKENS:,} (default {SHARD_TOKENS:,})"
            )
        return
    files = 2 + text_bytes // shard_tokens  # the two splits' last shards, and every full one
    if files > MAX_SHARDS:
        raise ConfigError(
            f"--shard-tokens={shard_tokens:,} would write up to {files:,} shard files for "
            f"{text_bytes:,} bytes of text; give at least {-(-text_bytes // (MAX_SHARDS - 2)):,} "
            f"(default {SHARD_TOKENS:,})"
        )


def _remove_partial(folder: Path, writers: dict[str, ShardWriter], existed: bool) -> None:
    """What a failed prepare wrote: its shards, the vocabulary and the manifest's temporary file, and the folder
    itself if prepare made it (a folder that was there stays, as it was)."""
    for writer in writers.values():
        if writer._file is not None:
            writer._file.close()
        for shard in writer.shards:
            (folder / shard["file"]).unlink(missing_ok=True)
    for leftover in (folder / "tokenizer.json", folder / f"manifest.json.tmp{os.getpid()}"):
        leftover.unlink(missing_ok=True)
    if not existed:
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
            folder.rmdir()


def _stream(source, tokenizer, writers: dict[str, ShardWriter]) -> dict:
    """Rows read lazily and sent to their sides as ``HFDataset.sides`` cuts them; each split's bytes are encoded in
    pieces that end at a newline (``PIECE`` bytes or more) as they fill."""
    if hasattr(tokenizer, "fit_stream") and getattr(tokenizer, "_tok", None) is None:
        # a first pass over the stream: the vocabulary, nothing held (only the first train_bytes, when set)
        tokenizer.fit_stream(_train_text(source, getattr(tokenizer, "train_bytes", None)))
    whole, train = integrity.Tally(), integrity.Tally()
    buffers = {"train": bytearray(), "val": bytearray()}

    def encode(split: str, final: bool = False) -> None:
        """The split's bytes held up to their last newline (all of them when ``final``) to its shards."""
        buf = buffers[split]
        cut = len(buf) if final else buf.rfind(b"\n") + 1
        if cut:
            writers[split].write(tokenizer.encode(bytes(buf[:cut])), cut)
            del buf[:cut]

    for split, data, last in source.sides(whole):
        if split == "train":
            train.update(data)
        buffers[split].extend(data)
        if len(buffers[split]) >= PIECE and not last:  # the last, partial block waits for the final piece
            encode(split)
    for split in buffers:
        encode(split, final=True)
    return {
        "name": f"hf:{source.describe()}",
        "sha256": whole.sha256.hexdigest(),
        "bytes": whole.bytes,
        "train_sha256": train.sha256.hexdigest(),
    }


def _train_text(source, limit: int | None = None) -> Iterator[str]:
    """The training split's text as the stream passes (what ``HFDataset.sides`` sends to train, decoded incrementally: a
    character a block boundary cuts decodes as the whole split's decode would), its first ``limit`` bytes when given
    (the stream is read no further)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    left = sys.maxsize if limit is None else limit
    for split, block, last in source.sides(integrity.Tally()):
        if split == "train":
            block, left = block[:left], left - min(left, len(block))
            yield decoder.decode(block, final=left == 0)
        if last or not left:  # a named validation split's rows follow the last block
            break
    yield decoder.decode(b"", final=True)
