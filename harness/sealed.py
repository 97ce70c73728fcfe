"""JSON records the harness writes and reads back, sealed with their own sha256 so damage is one line.

``write(path, record)`` writes ``record`` with a ``sha256`` key over its canonical JSON (sorted keys, no spaces),
atomically (a temporary file renamed over the old one); ``read(path, fix)`` returns the record without it, or raises
a ConfigError naming the file and ``fix`` when the file is not JSON, not an object, or its content no longer matches
its seal (edited, truncated, a flipped byte). A record written before seals (no ``sha256`` key) is read as it is.
Used for the run link beside a run's checkpoints (``run.json``), a sweep's record (``mlflow_sweep.json``) and a tuning
report's ``best.json``; the shard manifests (harness/data/shards.py) seal themselves the same way.

A file that is not JSON (a corpus cache, an array, an exported model) is sealed beside itself: ``write_bytes(path,
data)`` writes it and ``<path>.sha256``; ``check_file(path, fix)`` reads the seal back before the file is used
(True: whole; False: no seal, a file from before seals, which a cache rebuilds; a ConfigError naming the file and
``fix`` when its bytes differ). Checkpoints (harness/record/checkpoints.py) and cached vocabularies
(harness/data/subword.py) carry the same ``.sha256`` beside them.

Ground: imports nothing from the project but its errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness.errors import ConfigError

SEAL = "sha256"


def digest(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write(path: Path, record: dict) -> None:
    """``record`` and its seal to ``path``, atomically."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({**record, SEAL: digest(record)}, indent=1))
    tmp.replace(path)


def read(path: Path, fix: str, keys: Iterable[str] = ()) -> dict:
    """The record at ``path`` without its seal; a ConfigError naming the file and ``fix`` if it is damaged.
    ``keys``: the record's fields, when known: another key (a damaged seal's name, ``sha257``) is damage, not a
    record from before seals."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is damaged (not JSON: {' '.join(str(e).split())[:60]}); {fix}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} is damaged (not a JSON object); {fix}")
    near = [] if SEAL in record else [k for k in record if near_miss([k], SEAL)]
    if near:
        raise ConfigError(f"{path} is damaged (its seal's key reads {near[0]!r}); {fix}")
    if not intact(record):
        raise ConfigError(f"{path} is damaged (its content no longer matches its sha256); {fix}")
    known = set(keys)
    unknown = sorted(set(record) - {SEAL} - known) if known else []
    if unknown:
        raise ConfigError(f"{path} is damaged (keys {unknown} are none of its fields); {fix}")
    return {k: v for k, v in record.items() if k != SEAL}


def intact(record: dict) -> bool:
    """Whether a record read from JSON still matches its seal (one from before seals has none: True; a key one
    character off the seal's, ``sha2V6``, is the seal damaged, not a record from before seals)."""
    if SEAL not in record:
        return not near_miss(record, SEAL)
    return record[SEAL] == digest(record)


def near_miss(keys: Iterable[str], name: str) -> bool:
    """Whether a key among ``keys`` is ``name`` with one character changed (a flipped bit in a seal's key)."""
    return any(len(k) == len(name) and sum(a != b for a, b in zip(k, name, strict=True)) == 1 for k in keys)


# ---------------------------------------------------------------- files sealed beside themselves

FILE_SEAL = ".sha256"


def seal_path(path: Path) -> Path:
    return path.with_name(path.name + FILE_SEAL)


def sealed_files(files: dict[str, str | bytes]) -> dict[str, str | bytes]:
    """``files`` (name -> content, as a run's artifacts are logged) with each one's ``<name>.sha256`` beside it."""
    seals = {f"{name}{FILE_SEAL}": hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest() + "\n"
             for name, data in files.items()}
    return {**files, **seals}


def check_folder(folder: Path, fix: str) -> None:
    """Every sealed file in ``folder`` against its seal (files without one are not judged)."""
    for seal in sorted(folder.glob(f"*{FILE_SEAL}")):
        path = seal.with_name(seal.name[: -len(FILE_SEAL)])
        if path.is_file():
            check_file(path, fix)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def written_digest(seal: Path) -> str:
    """The digest a ``.sha256`` seal holds, as its writer wrote it (a damaged byte that is no UTF-8 reads as a
    character that matches no digest, and one that turns its newline into other white space counts too: a seal is
    exactly its digest and a newline, so any flipped bit of it refuses the file it seals)."""
    return seal.read_bytes().decode("utf-8", errors="replace").removesuffix("\n")


def seal_file(path: Path) -> None:
    """``<path>.sha256`` for the file at ``path`` as it is now, written whole or not at all."""
    seal = seal_path(path)
    tmp = seal.with_name(f"{seal.name}.tmp{os.getpid()}")
    tmp.write_text(file_digest(path) + "\n")
    tmp.replace(seal)


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` to ``path`` atomically, then its seal (a crash between leaves a file without one: unsealed)."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)
    seal_file(path)


def check_file(path: Path, fix: str) -> bool:
    """Whether ``path`` is sealed (False: no ``.sha256`` beside it); a ConfigError naming it and ``fix`` when its
    bytes are not those sealed (a flipped byte, a truncation, another file put in its place)."""
    seal = seal_path(path)
    try:
        written = written_digest(seal)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise ConfigError(f"{seal} cannot be read ({type(e).__name__}); {fix}") from None
    actual = file_digest(path)
    if actual != written:
        raise ConfigError(f"{path} is damaged (its sha256 {actual[:12]}… is not the {written[:12]}… written with it); "
                          f"{fix}")
    return True


# ---------------------------------------------------------------- a report folder, sealed as a whole

SUMS = "SHA256SUMS"  # coreutils' format: ``sha256sum -c SHA256SUMS`` checks a report without posbench


@contextlib.contextmanager
def report_folder(out: Path) -> Iterator[Path]:
    """A report folder written whole or not at all. The command writes its files into the yielded staging folder
    (beside ``out``, on its file system); when the block ends they replace ``out``'s files of the same names and
    ``SHA256SUMS`` lists exactly them, written last. If the block fails (a full disk mid-PNG, Ctrl-C) the staging
    folder is removed and ``out`` is as it was. A file in ``out`` the command did not write (a stale README.md of
    something else) stays where it is, unsealed."""
    import shutil
    import tempfile

    out = out.expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging
        names = sorted(p.name for p in staging.iterdir() if p.is_file() and not p.name.startswith("."))
        (staging / SUMS).write_text("".join(f"{file_digest(staging / name)}  {name}\n" for name in names))
        out.mkdir(exist_ok=True)
        for name in [*names, SUMS]:  # renames within one file system: nothing more to write, so nothing can fail
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def seal_report(folder: Path) -> Path:
    """``folder/SHA256SUMS``: the sha256 of each file a command left in the report folder ``folder`` (its own
    files and any beside them; not itself, nor hidden ones), one ``<hex>  <name>`` line each, written whole or not
    at all. Every command that writes a report folder calls it last; a command that reads one back checks it
    (``check_report``)."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS and not p.name.startswith("."))
    tmp = folder / f".{SUMS}.tmp{os.getpid()}"
    tmp.write_text("".join(f"{file_digest(folder / name)}  {name}\n" for name in names))
    tmp.replace(folder / SUMS)
    return folder / SUMS


def check_report(folder: Path, fix: str, needs: Iterable[str] = ()) -> bool:
    """Whether report folder ``folder`` is sealed (False: no SHA256SUMS, a report from before seals); a ConfigError
    naming the file and ``fix`` when a file it lists is missing or its bytes differ, a line is not one sha256sum
    writes, or a file in ``needs`` (what the reader is about to read) is not listed."""
    sums = folder / SUMS
    try:
        lines = sums.read_text().splitlines()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{sums} cannot be read ({type(e).__name__}); {fix}") from None
    listed = {}
    for number, line in enumerate(lines, 1):
        hexdigest, sep, name = line.partition("  ")
        if not sep or len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest) or "/" in name:
            raise ConfigError(f"{sums} is damaged (line {number} is not a sha256sum line: 64 hex digits, two spaces, "
                              f"a file name); {fix}")
        listed[name] = hexdigest
    for name in needs:
        if name not in listed:
            raise ConfigError(f"{folder / name} is not in {sums}: it was written after the report was sealed; {fix}")
    for name, hexdigest in listed.items():
        path = folder / name
        if not path.is_file():
            raise ConfigError(f"{path} is missing (its {SUMS} lists it); {fix}")
        actual = file_digest(path)
        if actual != hexdigest:
            raise ConfigError(f"{path} is damaged (its sha256 {actual[:12]}… is not the {hexdigest[:12]}… its {SUMS} "
                              f"lists); {fix}")
    return True
