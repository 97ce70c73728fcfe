"""Pre-tokenized corpora: token ids written once as memory-mapped shards (``python -m harness.data.prepare``),
trained from with ``data=tokens data.path=DIR`` (conf/data/tokens.yaml).

A folder holds ``manifest.json`` and the shards, raw little-endian arrays of ``dtype`` (uint16 when the
vocabulary has fewer than 65,536 ids, else uint32), ``train-00000.bin``, ``train-00001.bin``, …, ``val-00000.bin``.
The manifest records the corpus (name, sha256 and size of the text, the training split's sha256), the
tokenizer (its option, ``digest()``, vocabulary size, and for a trained vocabulary its recipe; the vocabulary
itself is saved beside the shards as ``tokenizer.json``), the dtype, and each split's tokens, bytes and shards
(each with its sha256), and its own checksum. A run whose configured tokenizer does not hash to the manifest's is
refused before it trains; so is a folder whose manifest was edited or whose shard's bytes changed after prepare
wrote them (``verify``: every shard hashed once per file version — size and modification time — the result kept
in the cache, so a large folder is read whole once, not at every run).

Training windows (``data.windows``): ``random`` (a uniform start, as for text) or ``sequential`` (consecutive
windows, overlapping by the one shifted token of a causal objective, wrapping around). Either way each DDP rank
reads only its own contiguous slice of the training tokens (``rank_slice``): example g belongs to rank g mod W
(harness/data/windows.py ``ContinueFrom``) and lies in that rank's slice. With one process the random windows
are exactly those of ``TrainWindows`` on the same ids; with W ranks which windows are read depends on W.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from harness.data.corpus import check_train_split
from harness.data.windows import _generator
from harness.errors import ConfigError

FORMAT = "posbench-tokens-1"
WINDOWS = ("random", "sequential")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


def rank_slice(n_tokens: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of the training tokens rank ``rank`` of ``world_size`` reads: W contiguous, disjoint slices
    covering all ``n_tokens``, their sizes differing by at most one token."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    return n_tokens * rank // world_size, n_tokens * (rank + 1) // world_size


class ShardedIds:
    """Shards read as one array of token ids: ``len`` and ``[a:b]`` (a slice may cross shards) are all windows need.
    ``vocab_size``: every id read is checked below it (a shard overwritten with other bytes of the same size is
    refused in one line when a window reaches them, instead of failing deep in the embedding)."""

    def __init__(self, arrays: list[np.ndarray], vocab_size: int | None = None):
        self.arrays = [a for a in arrays if len(a)]
        self.ends = np.cumsum([len(a) for a in self.arrays]).tolist()
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.uint16)
        self.vocab_size = vocab_size

    def __reduce__(self):
        """Pickled (a spawned DataLoader worker) as its files, mapped again: a memmap would pickle its data."""
        if all(isinstance(a, np.memmap) and a.filename for a in self.arrays):
            return _reopen, ([a.filename for a in self.arrays], self.dtype.str, self.vocab_size)
        return ShardedIds, (self.arrays, self.vocab_size)

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("ShardedIds takes contiguous slices [a:b]")
        start, stop, _ = index.indices(len(self))
        pieces = []
        for array, end in zip(self.arrays, self.ends, strict=True):
            begin = end - len(array)
            if stop <= begin:
                break
            if start < end:
                pieces.append(self._checked(array, array[max(start, begin) - begin: min(stop, end) - begin]))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)


    def _checked(self, array: np.ndarray, piece: np.ndarray) -> np.ndarray:
        if self.vocab_size is not None and len(piece) and int(piece.max()) >= self.vocab_size:
            where = getattr(array, "filename", None) or "a shard"
            raise ConfigError(f"{where} holds token id {int(piece.max())}, not below the vocabulary size "
                              f"{self.vocab_size} its manifest records: the shard is damaged; write the folder again "
                              "with python -m harness.data.prepare")
        return piece


def _reopen(files: list[str], dtype: str, vocab_size: int | None = None) -> ShardedIds:
    return ShardedIds([np.memmap(f, dtype=np.dtype(dtype), mode="r") for f in files], vocab_size)


@dataclass(frozen=True)
class TokenCorpus:
    """A prepared corpus: what train.py logs of a text corpus (name, sha256, size), and the ids themselves."""

    name: str
    sha256: str  # of the text, before splitting
    size: int  # bytes of text
    train_sha256: str
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

        loaded = load_file(str(self.folder / "tokenizer.json"))
        digest, recorded = hashlib.sha256(loaded.to_str().encode()).hexdigest(), self.manifest["tokenizer"]["digest"]
        if digest != recorded:  # the digest is Trained.digest(): sha256 of the vocabulary's JSON
            raise ConfigError(f"{self.folder / 'tokenizer.json'} is not the vocabulary the shards were written with "
                              f"(sha256 {digest[:12]}…, the manifest records {recorded[:12]}…); restore it, or write "
                              "the folder again with python -m harness.data.prepare")
        return loaded


CHECKSUM = "checksum"  # the manifest's own: sha256 of its canonical JSON without this key


def _canonical(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed(manifest: dict) -> dict:
    """``manifest`` with its checksum (``python -m harness.data.prepare`` writes it so)."""
    return {**manifest, CHECKSUM: _canonical(manifest)}


_VERIFIED: set[tuple[str, int, int, str]] = set()  # (file, size, mtime_ns, sha256) hashed by this process
# A folder of at most this many shard bytes is hashed again by every process that reads it (0.5 s here, 1.9 GiB/s),
# so a bit that rots in place, its size and mtime unchanged, is caught; a larger one once per file version (a stamp)
REHASH_BYTES = 1 << 30


def verify(folder: Path, manifest: dict) -> None:
    """Each shard's bytes hash to the sha256 the manifest records (manifests written before shards carried one
    are not checked). A file version already hashed by this process is not read again; nor, in a folder of more
    than ``REHASH_BYTES``, one hashed by any process before (its stamp in the cache, keyed by path, size and mtime:
    hashing hundreds of gigabytes at every start would cost minutes)."""
    from harness.data import corpus as corpus_module  # CACHE read at call time (tests point it elsewhere)

    stamps = corpus_module.CACHE / "verified-shards"
    shards = [(folder / s["file"], str(s["sha256"])) for split in ("train", "val")
              for s in manifest["splits"][split]["shards"] if "sha256" in s]
    stamped = sum(file.stat().st_size for file, _ in shards) > REHASH_BYTES
    for file, sha in shards:
        info = file.stat()
        key = (str(file.resolve()), info.st_size, info.st_mtime_ns, sha)
        stamp = stamps / hashlib.sha256(repr(key).encode()).hexdigest()
        if key in _VERIFIED or (stamped and stamp.exists()):
            continue
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        if digest.hexdigest() != sha:
            raise ConfigError(f"{file} is damaged: its sha256 {digest.hexdigest()[:12]}… is not the "
                              f"{sha[:12]}… manifest.json records (its bytes changed after "
                              "prepare wrote it); write the folder again with python -m harness.data.prepare")
        _VERIFIED.add(key)
        if stamped:
            try:
                stamps.mkdir(parents=True, exist_ok=True)
                stamp.touch()
            except OSError:  # a read-only cache: verified again next time, nothing lost
                pass


def _check_structure(manifest: dict, file: Path) -> None:
    """Every key and type a run reads from the manifest, so an edited one is one line, not a KeyError later."""
    try:
        for split in ("train", "val"):
            entry = manifest["splits"][split]
            int(entry["tokens"]), int(entry["bytes"])
            for shard in entry["shards"]:
                if Path(shard["file"]).name != shard["file"] or int(shard["tokens"]) < 0:
                    raise ValueError(f"shard {shard['file']!r}")
        np.dtype(manifest["dtype"])
        tokenizer, corpus = manifest["tokenizer"], manifest["corpus"]
        str(tokenizer["config"]), str(tokenizer["digest"]), int(tokenizer["vocab_size"])
        str(corpus["name"]), str(corpus["sha256"]), int(corpus["bytes"]), str(corpus["train_sha256"])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else " ".join(str(e).split())[:80]
        raise ConfigError(f"{file} is damaged ({type(e).__name__}: {what}); write the folder again with python -m "
                          "harness.data.prepare") from None


class TokenShards:
    """The ``data.source`` of ``data=tokens``: a folder ``python -m harness.data.prepare`` wrote."""

    def __init__(self, path: str | None = None, windows: str = "random"):
        if windows not in WINDOWS:
            raise ConfigError(f"data.windows={windows!r}: use data.windows=random or data.windows=sequential")
        self.path, self.windows = path, windows

    def manifest(self) -> dict:
        if not self.path:
            raise ConfigError("data=tokens needs the folder python -m harness.data.prepare wrote: add data.path=DIR")
        folder = Path(self.path).expanduser()
        file = folder / "manifest.json"
        if not file.is_file():
            raise ConfigError(f"data.path={self.path} has no manifest.json; write one with python -m "
                              "harness.data.prepare DIR data=... tokenizer=...")
        try:
            manifest = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{file} is not JSON ({e}); write the folder again with python -m harness.data.prepare") \
                from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ConfigError(f"{file} is not a {FORMAT} manifest; write the folder again with python -m "
                              "harness.data.prepare")
        if CHECKSUM in manifest and manifest[CHECKSUM] != _canonical(manifest):
            raise ConfigError(f"{file} was changed after prepare wrote it (its checksum no longer matches its "
                              "content); write the folder again with python -m harness.data.prepare")
        _check_structure(manifest, file)
        for split in ("train", "val"):
            for shard in manifest["splits"][split]["shards"]:
                size = (folder / shard["file"]).stat().st_size if (folder / shard["file"]).is_file() else None
                expected = shard["tokens"] * np.dtype(manifest["dtype"]).itemsize
                if size != expected:
                    raise ConfigError(f"{folder / shard['file']} is {'missing' if size is None else f'{size} bytes'}, "
                                      f"the manifest says {expected}; write the folder again with python -m "
                                      "harness.data.prepare")
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
                raise ConfigError(f"data.path={self.path} was tokenized with tokenizer={recorded['config']} "
                                  f"{recorded.get('recipe')}, not tokenizer={name} {recipe()}; set the tokenizer it "
                                  "was written with, or run python -m harness.data.prepare again with this one")
            return
        digest = tokenizer.digest()
        if digest != recorded["digest"]:
            raise ConfigError(f"data.path={self.path} was tokenized with tokenizer={recorded['config']} (digest "
                              f"{recorded['digest'][:12]}…), not with the configured tokenizer={name} (digest "
                              f"{digest[:12]}…); set the tokenizer it was written with, or run python -m "
                              "harness.data.prepare again with this one")

    def load(self) -> TokenCorpus:
        manifest, folder = self.manifest(), Path(self.path).expanduser()
        dtype = np.dtype(manifest["dtype"])

        def ids(split: str) -> ShardedIds:
            return ShardedIds([np.memmap(folder / s["file"], dtype=dtype, mode="r") if s["tokens"] else
                               np.empty(0, dtype) for s in manifest["splits"][split]["shards"]],
                              manifest["tokenizer"]["vocab_size"])

        corpus, val = manifest["corpus"], manifest["splits"]["val"]
        return TokenCorpus(corpus["name"], corpus["sha256"], corpus["bytes"], corpus["train_sha256"], ids("train"),
                           ids("val"), val["bytes"] / max(1, val["tokens"]), self.windows, folder, manifest)


class SlicedWindows(Dataset):
    """``n`` training windows of ``length`` tokens; example g lies in rank (g mod W)'s ``rank_slice``.

    random: a uniform start in the slice, drawn from (seed, g) as ``TrainWindows`` draws it; sequential: the
    (g div W)-th window of the slice, windows advancing ``stride`` tokens and wrapping around.
    """

    def __init__(self, ids, length: int, n: int, seed: int, objective, windows: str = "random",
                 world_size: int = 1, stride: int | None = None):
        self.ids, self.length, self.n, self.seed, self.objective = ids, length, n, seed, objective
        self.windows, self.world_size, self.stride = windows, world_size, stride or length
        self.slices = [rank_slice(len(ids), r, world_size) for r in range(world_size)]
        smallest = min(end - start for start, end in self.slices)
        check_train_split(smallest, length)  # every rank's slice holds more than one window
        if world_size > 1 and smallest <= length:
            raise ConfigError(f"each of the {world_size} ranks reads {smallest} training tokens, not more than one "
                              f"window of {length}; lower data.seq_len or prepare a larger corpus")

    def __len__(self) -> int:
        return self.n

    def start(self, index: int, gen: torch.Generator) -> int:
        """Where example ``index`` starts (random: drawn from ``gen``, which then goes on to the objective)."""
        lo, hi = self.slices[index % self.world_size]
        if self.windows == "random":
            return lo + int(torch.randint(hi - lo - self.length + 1, (1,), generator=gen))
        per_slice = (hi - lo - self.length) // self.stride + 1
        return lo + (index // self.world_size) % per_slice * self.stride

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = _generator(self.seed, index)
        start = self.start(index, gen)
        window = torch.from_numpy(np.asarray(self.ids[start:start + self.length]).astype(np.int64))
        return self.objective.make_example(window, torch.ones(self.length, dtype=torch.bool), gen)
