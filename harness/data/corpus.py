"""Text sources. Each yields a ``Corpus``: train/val bytes plus what identifies them.

- ``Embedded``: English prose that ships with every CPython — the pydoc topics and the
  docstrings of the standard library, read with ``ast`` (nothing imported), sorted.
- ``TextFiles``: any local UTF-8 file or directory of files.
- ``Enwik8``: the Hutter-prize file, standard 90M/5M/5M byte split.

A download's host is probed once before it is asked (``unreachable``: enwik8's, and the Hugging Face Hub's).
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import functools
import io
import os
import socket
import sys
import sysconfig
import threading
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import numpy as np

from harness import integrity
from harness.errors import ConfigError, one_line
from harness.ranges import Range, ranged

CACHE = Path(os.environ.get("POSBENCH_CACHE", Path.home() / ".cache" / "posbench"))
PROBE_SECONDS = 3.0  # one connection attempt to a download's host (``unreachable``)
ValEvery = Annotated[int, Range("≥ 2 (every N-th 4 KiB block is validation)", ge=2)]  # data.source.val_every


@dataclass(frozen=True)
class Corpus:
    name: str
    train: bytes
    val: bytes
    sha256: str  # of the whole corpus before splitting
    size: int  # bytes, before splitting
    # Where packed documents start, byte offsets into (train, val) (``split_starts``); None: not asked for, or a
    # source that does not know (model.restart_positions / model.document_mask ask: ``with_documents``)
    starts: tuple[np.ndarray, np.ndarray] | None = None


def with_documents(corpus: Corpus, source) -> Corpus:
    """``corpus`` carrying its documents' starts, from a source that passes them (``document_starts``)."""
    return dataclasses.replace(corpus, starts=source.document_starts())


def block_split(data: bytes, val_every: int = 20, block: int = 4096) -> tuple[bytes, bytes]:
    """Deterministic split: every ``val_every``-th block of ``block`` bytes goes to val.

    Spreading val across the corpus keeps it representative of every source file.
    """
    blocks = [data[i : i + block] for i in range(0, len(data), block)]
    return (
        b"".join(b for n, b in enumerate(blocks) if n % val_every != val_every - 1),
        b"".join(b for n, b in enumerate(blocks) if n % val_every == val_every - 1),
    )


def split_starts(
    starts: np.ndarray, size: int, val_every: int = 20, block: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """Document starts (byte offsets, sorted) of the whole text, in each split's bytes after ``block_split``: a
    start moves with its block; a block whose predecessor went to the other split starts a document too (the
    text jumps there). Returns (train, val) int64 offsets, each from 0."""
    starts = np.asarray(starts, dtype=np.int64)
    n = starts // block  # the block each start is in
    val_before = n // val_every  # val blocks before block n (they are the blocks k·val_every + val_every − 1)
    is_val = n % val_every == val_every - 1
    inner = starts % block
    blocks = -(-size // block)
    seams_train = [(m - m // val_every) * block for m in range(val_every, blocks, val_every)]  # after a val block
    seams_val = [k * block for k in range(blocks // val_every)]  # val blocks are never adjacent (val_every ≥ 2)
    train = np.union1d((n - val_before)[~is_val] * block + inner[~is_val], [0, *seams_train])
    val = np.union1d(val_before[is_val] * block + inner[is_val], seams_val or [0])
    return train.astype(np.int64), val.astype(np.int64)


# Magic numbers of what users pass instead of text: (leading bytes, what it is, how to fix it).
NOT_TEXT = (
    (b"\xff\xfe\x00\x00", "UTF-32", "convert it (iconv -f UTF-32 -t UTF-8)"),  # before UTF-16 LE: same first two bytes
    (b"\x00\x00\xfe\xff", "UTF-32", "convert it (iconv -f UTF-32 -t UTF-8)"),
    (b"\xff\xfe", "UTF-16", "convert it (iconv -f UTF-16 -t UTF-8)"),
    (b"\xfe\xff", "UTF-16", "convert it (iconv -f UTF-16 -t UTF-8)"),
    (b"PK\x03\x04", "a zip archive", "unzip it"),
    (b"\x1f\x8b", "gzip-compressed", "gunzip it"),
    (b"BZh", "bzip2-compressed", "bunzip2 it"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz it"),
)


def _check_readable(key: str, path: Path) -> None:
    """``path`` is a regular file this process may read (a FIFO or device would block or never end)."""
    if not path.is_file():
        raise ConfigError(f"{key}: {path} is not a regular file; point {key} at the file itself")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{key}: {path} is not readable; fix its permissions (chmod +r) or point {key} elsewhere")


def _check_utf8(path: Path, chunk: int = 1 << 20) -> None:
    """The whole file decodes as UTF-8 (streamed: a large corpus is not held twice); a file in another
    encoding or compressed is named by its leading bytes, with the command that converts it."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        head = f.read(8)
        for magic, what, fix in NOT_TEXT:
            if head.startswith(magic):
                raise ConfigError(f"{path} is {what}, not UTF-8 text; {fix} and point data.path at the result")
        f.seek(0)
        while True:
            block = f.read(chunk)
            pending = len(decoder.getstate()[0])  # bytes of a character split across blocks
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{path} is not UTF-8 (bad byte at offset {offset - pending + e.start}); "
                    "convert it, e.g. iconv -f LATIN1 -t UTF-8 (name its real encoding)"
                ) from None
            if not block:
                return
            offset += len(block)


def _split_sizes(total: int, val_every: int = 20, block: int = 4096) -> tuple[int, int]:
    """(train, val) byte counts ``block_split`` gives a corpus of ``total`` bytes, without the bytes."""
    val = sum(min(block, total - start) for start in range((val_every - 1) * block, total, val_every * block))
    return total - val, val


def check_train_split(n_tokens: int, length: int) -> None:
    """The training split must hold more than one window (a window's start is drawn at random)."""
    if n_tokens <= length:
        raise ConfigError(
            f"the training split has {n_tokens} tokens, not more than one window of {length}; "
            "lower data.seq_len or use a larger corpus"
        )


def check_val_split(n_tokens: int, extra_tokens: int) -> None:
    if n_tokens <= extra_tokens:
        raise ConfigError(
            f"the validation split has {n_tokens} tokens; give a larger corpus (every "
            "data.source.val_every-th 4 KiB block is validation) or lower data.source.val_every"
        )


def _corpus(name: str, data: bytes, train: bytes, val: bytes) -> Corpus:
    return Corpus(name, train, val, integrity.sha256(data), len(data))


# --- embedded -------------------------------------------------------------------------

_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "__pycache__",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "tkinter",
}


def joined_starts(sizes: list[int], separator: int = 2) -> np.ndarray:
    """Byte offsets where each of the parts of ``sizes`` bytes starts once joined by a ``separator``-byte gap."""
    return np.concatenate(([0], np.cumsum(np.asarray(sizes[:-1], dtype=np.int64) + separator))).astype(np.int64)


@functools.cache  # a fresh cache builds the text and its document starts: one parse of the stdlib serves both
def _stdlib_parts() -> tuple[str, ...]:
    """The embedded corpus's documents: each pydoc topic (sorted by key), then each stdlib docstring (files sorted by
    path)."""
    import pydoc_data.topics

    parts = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are templates or legacy encodings
        documented = [
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        parts += [doc for doc in map(ast.get_docstring, documented) if doc]
    return tuple(parts)


class Embedded:
    """The default corpus: ~2 MB of stdlib prose; identical on machines with the same Python."""

    @ranged
    def __init__(self, val_every: ValEvery = 20):
        self.val_every = val_every

    def sizes(self) -> tuple[int, int]:
        """(train, val) bytes, without holding the corpus (built once per machine and cached)."""
        return _split_sizes(self._cached().stat().st_size, self.val_every)

    def load(self) -> Corpus:
        data = self._cached().read_bytes()
        return _corpus(f"embedded-python{_version()}", data, *block_split(data, self.val_every))

    def document_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """Each pydoc topic and docstring a document: (train, val) byte offsets (``split_starts``), cached beside
        the text."""

        def npy() -> bytes:
            array = io.BytesIO()
            np.save(array, joined_starts([len(p.encode("utf-8")) for p in _stdlib_parts()]))
            return array.getvalue()

        text = self._cached()
        starts = np.load(integrity.cached(text.with_suffix(".starts.npy"), npy))
        return split_starts(starts, text.stat().st_size, self.val_every)

    @staticmethod
    def _cached() -> Path:
        """The text (the documents joined by blank lines), built once per machine (``integrity.cached``)."""
        return integrity.cached(
            CACHE / f"stdlib-prose-{_version()}.txt", lambda: "\n\n".join(_stdlib_parts()).encode("utf-8")
        )


def _no_download(why: str) -> ConfigError:
    return ConfigError(
        f"cannot download enwik8 ({why}); fetch {ENWIK8_URL}, unzip it and pass data.path=/path/to/enwik8"
    )


def _version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


# --- local text -----------------------------------------------------------------------


class TextFiles:
    """A UTF-8 file, or every file under a directory (sorted by path)."""

    @ranged
    def __init__(self, path: str | None = None, val_every: ValEvery = 20):
        self.path, self.val_every = path, val_every

    def sizes(self) -> tuple[int, int]:
        """(train, val) bytes from the files' sizes, after every check of the files (``_files``, which reads each
        through once for UTF-8)."""
        files = self._files()
        total = sum(f.stat().st_size for f in files) + 2 * max(len(files) - 1, 0)  # joined by blank lines
        if total < 4096:
            raise ConfigError(f"data.path={self.path} holds {total} bytes; give at least 4 KiB of text")
        return _split_sizes(total, self.val_every)

    def _root(self) -> Path:
        """data.path, expanded; refused when it is not set."""
        if not self.path:
            raise ConfigError("data=text needs a file or directory: add data.path=FILE_OR_DIR")
        return Path(self.path).expanduser()

    def _files(self) -> list[Path]:
        """The file, or the regular files under the directory (hidden ones, e.g. .git, left out), each
        readable and UTF-8."""
        root = self._root()
        if not root.exists():
            raise ConfigError(f"data.path={self.path} does not exist; point it at a UTF-8 text file or directory")
        if root.is_dir():
            files = sorted(
                p
                for p in root.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
            )
            if not files:
                raise ConfigError(
                    f"data.path={self.path} is a directory with no files in it; put text files "
                    "there or point data.path at a file"
                )
        else:
            files = [root]
        for f in files:
            _check_readable("data.path", f)
            _check_utf8(f)
        return files

    def load(self) -> Corpus:
        data = b"\n\n".join(f.read_bytes() for f in self._files())  # each checked UTF-8 by _files()
        if len(data) < 4096:
            raise ConfigError(f"data.path={self.path} holds {len(data)} bytes; give at least 4 KiB of text")
        return _corpus(f"text:{self._root().name}", data, *block_split(data, self.val_every))

    def document_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """Each file a document: (train, val) byte offsets (``split_starts``)."""
        sizes = [f.stat().st_size for f in self._files()]
        return split_starts(joined_starts(sizes), sum(sizes) + 2 * (len(sizes) - 1), self.val_every)


# --- enwik8 ---------------------------------------------------------------------------

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"  # the unzipped file
ENWIK8_BYTES = 100_000_000


@functools.cache
def unreachable(endpoint: str) -> str | None:
    """Why ``endpoint``'s host cannot be reached (one TCP connection, at most a few seconds, asked once per process),
    or None: a download's precondition, checked by the checks and the run alike (enwik8)."""
    parts = urlsplit(endpoint)
    host, port = parts.hostname or endpoint, parts.port or (80 if parts.scheme == "http" else 443)
    answer: list[str | None] = []

    def probe() -> None:  # in a thread: a name lookup has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            answer.append(None)
        except OSError as e:
            answer.append(f"{endpoint} cannot be reached: {one_line(e) or type(e).__name__}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS + 1)
    return answer[0] if answer else f"{endpoint} did not answer within {PROBE_SECONDS:g} s"


class Enwik8:
    """First 10^8 bytes of English Wikipedia (2006); train/val = [0, 90M) / [90M, 95M).

    Reads ``path`` (the unzipped ``enwik8`` file). If it is missing and ``download`` is
    true, fetches the zip, checks the file's sha256 and saves it at ``path``.
    """

    def __init__(self, path: str | None = None, download: bool = True):
        self.path = Path(path).expanduser() if path else CACHE / "enwik8"
        if self.path.is_dir() and (self.path / "enwik8").exists():
            self.path = self.path / "enwik8"  # the directory holding it
        self.download = download

    def sizes(self) -> tuple[int, int]:
        """The standard split's sizes; a file that is there must be enwik8 (checked by size, then sha256)."""
        if not self.path.exists():
            if not self.download:
                raise ConfigError(f"{self.path} not found; set data.path=/path/to/enwik8 or data.download=true")
            why = unreachable(ENWIK8_URL)  # the download the run would make: refused here alike, before it
            if why:
                raise _no_download(why)
        elif self.path.is_dir():
            raise ConfigError(
                f"data.path={self.path} is a directory without an enwik8 file; point it at the unzipped enwik8 file"
            )
        else:
            _check_readable("data.path", self.path)
            if zipfile.is_zipfile(self.path):
                raise ConfigError(
                    f"{self.path} is the zip archive; unzip it and point data.path at the enwik8 file inside"
                )
            if (size := self.path.stat().st_size) != ENWIK8_BYTES:
                raise ConfigError(
                    f"{self.path} holds {size:,} bytes, enwik8 holds {ENWIK8_BYTES:,}; point data.path "
                    f"at the enwik8 file (from {ENWIK8_URL})"
                )
            self._verified(self.path.read_bytes())
        return 90_000_000, 5_000_000

    def load(self) -> Corpus:
        if not self.path.is_file():  # missing, a directory without enwik8, or no regular file
            self.sizes()  # refuses all but a missing file it may download
            self._fetch()
        data = self.path.read_bytes()
        return Corpus("enwik8", data[:90_000_000], data[90_000_000:95_000_000], self._verified(data), len(data))

    def _verified(self, data: bytes) -> str:
        digest = integrity.sha256(data)
        if digest != ENWIK8_SHA256:
            raise ConfigError(
                f"{self.path} is not enwik8 (sha256 {digest[:12]}…, expected {ENWIK8_SHA256[:12]}…); "
                f"delete it or re-download from {ENWIK8_URL}"
            )
        return digest

    def _fetch(self) -> None:
        try:
            with urllib.request.urlopen(ENWIK8_URL, timeout=60) as r:
                archive = r.read()
        except OSError as e:
            raise _no_download(f"{e.__class__.__name__}: {e}") from None
        data = zipfile.ZipFile(io.BytesIO(archive)).read("enwik8")
        if integrity.sha256(data) != ENWIK8_SHA256:
            raise ConfigError(f"downloaded enwik8 failed its sha256 check; try again or fetch {ENWIK8_URL} by hand")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(self.path)
