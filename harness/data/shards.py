"""Pre-tokenized corpora: token ids written once as memory-mapped shards (``posbench prepare``),
trained from with ``data=tokens data.path=DIR`` (conf/data/tokens.yaml).

A folder holds ``manifest.json`` and the shards, raw little-endian arrays of ``dtype`` (uint16 when the
vocabulary has fewer than 65,536 ids, else uint32), ``train-00000.bin``, ``train-00001.bin``, …, ``val-00000.bin``.
The manifest records the corpus (name, sha256 and size of the text, the training split's sha256), the
tokenizer (its option, ``digest()``, vocabulary size, and for a trained vocabulary its recipe; the vocabulary
itself is saved beside the shards as ``tokenizer.json``), the dtype, and each split's tokens, bytes and shards
(each with its sha256 and the digest of each ``BLOCK_BYTES`` block), and the manifest's own seal
(harness/integrity.py). A run whose configured tokenizer does not hash to the manifest's is refused before it
trains; so is a folder whose manifest was edited or whose shard's bytes changed after prepare wrote them
(``verify``: a folder of at most ``REHASH_BYTES`` hashed whole at every start; a larger one block by block as its
reads reach each block, ``ShardedIds``: hashing hundreds of gigabytes at every start would cost minutes). A folder
of another format (an earlier posbench's) is refused: write it again.

Training windows (``data.windows``): ``random`` (a uniform start, as for text) or ``sequential`` (consecutive
windows, overlapping by the one shifted token of a causal objective, wrapping around), cut by harness/data/windows.py
``TrainWindows``. Either way each DDP rank reads only its own contiguous slice of the training tokens
(``rank_slice``): example g belongs to rank g mod W (``ContinueFrom``) and lies in that rank's slice. With one
process the random windows are exactly those of text on the same ids; with W ranks which windows are read depends on W.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness import integrity
from harness.errors import ConfigError, one_line

FORMAT = "posbench-tokens-2"  # a folder of another format is refused: write it again
FIX = "write the folder again with posbench prepare"
WINDOWS = ("random", "sequential")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


BLOCK_BYTES = 1 << 22  # a shard's bytes are digested in blocks of this size too (prepare records them)


def block_digest(hasher) -> str:
    """A block's digest as the manifest records it: its sha256, the first 128 bits (for damage, not forgery)."""
    return hasher.hexdigest()[:32]


class ShardedIds:
    """Shards read as one array of token ids: ``len`` and ``[a:b]`` (a slice may cross shards) are all windows need.
    ``vocab_size``: every id read is checked below it (a shard overwritten with other bytes of the same size is
    refused in one line when a window reaches them, instead of failing deep in the embedding).
    ``blocks``: per array, the digests of its ``BLOCK_BYTES`` blocks (or None); each block a read reaches is hashed
    the first time this process reads it and refused if it differs — a folder too large to hash whole at every start
    is so checked before use, block by block, at the cost of one hash of what is read."""

    def __init__(
        self,
        arrays: list[np.ndarray],
        vocab_size: int | None = None,
        blocks: list[list[str] | None] | None = None,
        block_bytes: int = BLOCK_BYTES,
    ):
        kept = [(a, b) for a, b in zip(arrays, blocks or [None] * len(arrays), strict=True) if len(a)]
        self.arrays, self.blocks = [a for a, _ in kept], [b for _, b in kept]
        self.ends = np.cumsum([len(a) for a in self.arrays]).tolist()
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.uint16)
        self.vocab_size, self.block_bytes = vocab_size, block_bytes
        self._checked_blocks: list[set[int]] = [set() for _ in self.arrays]

    def __reduce__(self):
        """Pickled (a spawned DataLoader worker) as its files, mapped again: a memmap would pickle its data."""
        mapped = [a.filename for a in self.arrays if isinstance(a, np.memmap) and a.filename]
        if len(mapped) == len(self.arrays):
            return _reopen, (mapped, self.dtype.str, self.vocab_size, self.blocks, self.block_bytes)
        return ShardedIds, (self.arrays, self.vocab_size, self.blocks, self.block_bytes)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("ShardedIds takes contiguous slices [a:b]")
        start, stop, _ = index.indices(len(self))
        pieces = []
        for k, (array, end) in enumerate(zip(self.arrays, self.ends, strict=True)):
            begin = end - len(array)
            lo, hi = max(start, begin) - begin, min(stop, end) - begin  # the slice's part in this array, if any
            if lo < hi:
                self._check_blocks(k, lo, hi)
                pieces.append(self._checked(array, array[lo:hi]))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)

    def _check_blocks(self, k: int, lo: int, hi: int) -> None:
        """Array ``k``'s blocks that ids [lo, hi) lie in hash to the digests prepare recorded."""
        digests, size = self.blocks[k], self.block_bytes
        if digests is None:
            return
        raw = self.arrays[k].view(np.uint8)
        item = self.dtype.itemsize
        for block in range(lo * item // size, (hi * item - 1) // size + 1):
            if block in self._checked_blocks[k]:
                continue
            data = raw[block * size : (block + 1) * size]
            if block >= len(digests) or block_digest(hashlib.sha256(np.ascontiguousarray(data).data)) != digests[block]:
                where = getattr(self.arrays[k], "filename", None) or f"shard {k}"
                raise ConfigError(
                    f"{where} is damaged: its bytes {block * size}–{block * size + len(data)} do not "
                    f"hash to the digest manifest.json records (they changed after prepare wrote them); "
                    f"{FIX}"
                )
            self._checked_blocks[k].add(block)

    def _checked(self, array: np.ndarray, piece: np.ndarray) -> np.ndarray:
        if self.vocab_size is not None and len(piece) and int(piece.max()) >= self.vocab_size:
            where = getattr(array, "filename", None) or "a shard"
            raise ConfigError(
                f"{where} holds token id {int(piece.max())}, not below the vocabulary size "
                f"{self.vocab_size} its manifest records: the shard is damaged; write the folder again "
                "with posbench prepare"
            )
        return piece


def _reopen(
    files: list[str], dtype: str, vocab_size: int | None = None, blocks=None, block_bytes: int = BLOCK_BYTES
) -> ShardedIds:
    return ShardedIds([np.memmap(f, dtype=np.dtype(dtype), mode="r") for f in files], vocab_size, blocks, block_bytes)


@dataclass(frozen=True)
class TokenCorpus:
    """A prepared corpus: what train.py logs of a text corpus (name, sha256, size), and the ids themselves."""

    name: str
    sha256: str  # of the text, before splitting
    size: int  # bytes of text
    train_ids: ShardedIds
    val_ids: ShardedIds
    val_bytes_per_token: float  # bits/byte of the validation split (harness/data/tokenizer.py)
    windows: str
    folder: Path
    manifest: dict
    per_rank = True  # the loaders pass the world size: each rank reads its own slice (make_loaders)

    def ids(self, split: str):
        return self.train_ids if split == "train" else self.val_ids

    def fitted_tokenizer(self, tokenizer):
        """The vocabulary the shards were written with, for a trained tokenizer (``Trained.fit``) with the
        manifest's recipe: the folder's tokenizer.json (``TokenShards.check_tokenizer`` refused others)."""
        from harness.data.subword import load_file

        file = self.folder / "tokenizer.json"
        integrity.check_digest(file, self.manifest["tokenizer"]["file_sha256"], "manifest.json records", FIX)
        return load_file(str(file))  # its bytes are those prepare wrote, so its digest is the manifest's


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (file, size, mtime_ns, sha256) hashed by this process
# A folder of at most this many shard bytes is hashed whole by every process that reads it (a fraction of a second),
# so a bit that rots in place, its size and mtime unchanged, is caught; a larger one block by block as it is read
# (``ShardedIds``, against the block digests every manifest records)
REHASH_BYTES = 1 << 30
HASH_WHOLE_ENV = "POSBENCH_HASH_WHOLE_BYTES"  # sets that limit for a machine (0: every folder block by block)


def hash_whole_bytes() -> int:
    """The most shard bytes a folder may hold to be hashed whole at every start: ``$POSBENCH_HASH_WHOLE_BYTES``,
    else ``REHASH_BYTES``."""
    value = os.environ.get(HASH_WHOLE_ENV)
    if value is None:
        return REHASH_BYTES
    with contextlib.suppress(ValueError):
        if int(value) >= 0:
            return int(value)
    raise ConfigError(
        f"{HASH_WHOLE_ENV}={value!r} must be a whole number of bytes (0: check every folder "
        "block by block as it is read); set it so, or unset it"
    )


def _shard_list(manifest: dict) -> list[dict]:
    return [s for split in ("train", "val") for s in manifest["splits"][split]["shards"]]


def _checked_by_block(folder: Path, manifest: dict) -> bool:
    """True when ``folder`` is too large to hash whole at every start: its reads check each block they reach
    (``ShardedIds``) instead."""
    return sum((folder / s["file"]).stat().st_size for s in _shard_list(manifest)) > hash_whole_bytes()


def verify(folder: Path, manifest: dict) -> None:
    """Each shard's bytes hash to the sha256 the manifest records, unless the folder is checked block by block as
    it is read (``_checked_by_block``). A file version already hashed by this process is not read again."""
    if _checked_by_block(folder, manifest):
        return
    for shard in _shard_list(manifest):
        file, info = folder / shard["file"], (folder / shard["file"]).stat()
        key = (str(file.resolve()), info.st_size, info.st_mtime_ns, shard["sha256"])
        if key not in _VERIFIED:
            integrity.check_digest(file, shard["sha256"], "manifest.json records", FIX)
            _VERIFIED.add(key)


def _check_structure(manifest: dict, file: Path) -> None:
    """Every key and type a run reads from the manifest, so an edited one is one line, not a KeyError later."""
    try:
        for split in ("train", "val"):
            entry = manifest["splits"][split]
            int(entry["tokens"]), int(entry["bytes"])
            for shard in entry["shards"]:
                if Path(shard["file"]).name != shard["file"] or int(shard["tokens"]) < 0:
                    raise ValueError(f"shard {shard['file']!r}")
                str(shard["sha256"])
                if not all(isinstance(d, str) for d in shard["blocks"]):
                    raise ValueError(f"shard {shard['file']!r}'s blocks")
        if int(manifest["block_bytes"]) <= 0:
            raise ValueError("block_bytes")
        np.dtype(manifest["dtype"])
        tokenizer, corpus = manifest["tokenizer"], manifest["corpus"]
        str(tokenizer["config"]), str(tokenizer["digest"]), int(tokenizer["vocab_size"])
        str(corpus["name"]), str(corpus["sha256"]), int(corpus["bytes"]), str(corpus["train_sha256"])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else one_line(e)[:80]
        raise ConfigError(f"{file} is damaged ({type(e).__name__}: {what}); {FIX}") from None


class TokenShards:
    """The ``data.source`` of ``data=tokens``: a folder ``posbench prepare`` wrote."""

    def __init__(self, path: str | None = None, windows: str = "random"):
        if windows not in WINDOWS:
            raise ConfigError(f"data.windows={windows!r}: use data.windows=random or data.windows=sequential")
        self.path, self.windows = path, windows

    def _folder(self) -> Path:
        """data.path, expanded; refused when it is not set."""
        if not self.path:
            raise ConfigError("data=tokens needs the folder posbench prepare wrote: add data.path=DIR")
        return Path(self.path).expanduser()

    def manifest(self) -> dict:
        folder = self._folder()
        file = folder / "manifest.json"
        if not file.is_file():
            raise ConfigError(
                f"data.path={self.path} has no manifest.json; write one with posbench "
                "prepare DIR data=... tokenizer=..."
            )
        manifest = integrity.read(file, FIX)
        if manifest.get("format") != FORMAT:
            raise ConfigError(f"{file} is not a {FORMAT} manifest (an earlier posbench's, or another program's); {FIX}")
        _check_structure(manifest, file)
        for shard in _shard_list(manifest):
            size = (folder / shard["file"]).stat().st_size if (folder / shard["file"]).is_file() else None
            expected = shard["tokens"] * np.dtype(manifest["dtype"]).itemsize
            if size != expected:
                raise ConfigError(
                    f"{folder / shard['file']} is {'missing' if size is None else f'{size} bytes'}, "
                    f"the manifest says {expected}; {FIX}"
                )
        verify(folder, manifest)
        return manifest

    def sizes(self) -> tuple[int, int]:
        """(train, val) tokens; validation compares them with byte counts only for the byte tokenizer, whose
        tokens are bytes."""
        splits = self.manifest()["splits"]
        return splits["train"]["tokens"], splits["val"]["tokens"]

    def check_tokenizer(self, tokenizer, name: str) -> None:
        """The configured tokenizer is the one the shards were written with (by digest; a tokenizer trained on
        the corpus: by its recipe, then it loads the folder's vocabulary)."""
        recorded = self.manifest()["tokenizer"]
        recipe = getattr(tokenizer, "recipe", None)
        if recipe is not None and getattr(tokenizer, "_tok", None) is None:  # trained, not yet: the recipe decides
            if recorded.get("recipe") != recipe():
                raise ConfigError(
                    f"data.path={self.path} was tokenized with tokenizer={recorded['config']} "
                    f"{recorded.get('recipe')}, not tokenizer={name} {recipe()}; set the tokenizer it "
                    "was written with, or run posbench prepare again with this one"
                )
            # the vocabulary the run loads (``TokenCorpus.fitted_tokenizer``), checked before anything starts
            integrity.check_digest(
                self._folder() / "tokenizer.json", recorded["file_sha256"], "manifest.json records", FIX
            )
            return
        digest = tokenizer.digest()
        if digest != recorded["digest"]:
            raise ConfigError(
                f"data.path={self.path} was tokenized with tokenizer={recorded['config']} (digest "
                f"{recorded['digest'][:12]}…), not with the configured tokenizer={name} (digest "
                f"{digest[:12]}…); set the tokenizer it was written with, or run posbench "
                "prepare again with this one"
            )

    def load(self) -> TokenCorpus:
        manifest, folder = self.manifest(), self._folder()
        dtype = np.dtype(manifest["dtype"])

        by_block = _checked_by_block(folder, manifest)

        def ids(split: str) -> ShardedIds:
            shards = manifest["splits"][split]["shards"]
            return ShardedIds(
                [
                    np.memmap(folder / s["file"], dtype=dtype, mode="r") if s["tokens"] else np.empty(0, dtype)
                    for s in shards
                ],
                manifest["tokenizer"]["vocab_size"],
                [s["blocks"] for s in shards] if by_block else None,
                int(manifest["block_bytes"]),
            )

        corpus, val = manifest["corpus"], manifest["splits"]["val"]
        return TokenCorpus(
            corpus["name"],
            corpus["sha256"],
            corpus["bytes"],
            ids("train"),
            ids("val"),
            val["bytes"] / max(1, val["tokens"]),
            self.windows,
            folder,
            manifest,
        )
