"""What every command checks before it works: the store it writes or reads, the folder it writes, and the
numbers its flags carry. One set of checks for ``run.py`` (through its checks), ``python -m
harness.bench`` and ``python -m results``, so a value one entry point refuses is refused by all, in one
line, before anything is measured, read or written.

- a store: the URI parses, names a scheme MLflow opens, an sqlite file that is a whole database (its
  header's page count against its size: a truncated copy is caught without reading it) or can be
  created, a server that answers (store.py's checks); one to read must exist;
- an output folder: a non-empty path where a folder can be made and written (tried in a uniquely named scratch
  folder, then removed again: ``/proc/x`` passes a permission test and fails on the first write);
- a number: finite, within the range declared for it (harness/ranges.py), the same declaration run.py's
  schema reads (``--min-order-gain`` is ``report.min_order_gain``).
"""

from __future__ import annotations

import argparse
import math
import stat
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.ranges import violated
from harness.record.store import check_store, resolve_tracking_uri, sqlite_path


def store_to_write(configured: str | None) -> str:
    """The store a command will write (created when missing), checked; its resolved URI."""
    uri = resolve_tracking_uri(configured)
    check_store(uri)
    return uri


def store_to_read(configured: str | None, flag: str = "--tracking-uri") -> str:
    """The store a command reads: it must exist already (reading never creates one)."""
    uri = resolve_tracking_uri(configured)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise ConfigError(
            f"no MLflow store at {db}; pass {flag} sqlite:////path/to/mlflow.db or set "
            "MLFLOW_TRACKING_URI to the store your runs went to"
        )
    check_store(uri)
    return uri


def output_dir(value: str | Path, flag: str = "--out") -> Path:
    """A folder the command may write, absolute. The check writes only inside a scratch folder of a unique
    name, removed again: it creates nothing under the path's own name, so two commands checking the same
    folder at once (two benches with the default --out) never see each other's probe."""
    if not str(value).strip():
        raise ConfigError(f"{flag} '' names no folder; give one, e.g. {flag} results/mine/")
    path = Path(value).expanduser().absolute()
    existing, missing, is_dir = _deepest_existing(path)
    if not is_dir:
        raise ConfigError(
            f"{flag}: cannot create {path} ({existing} is not a directory); choose a folder you can write"
        )
    try:
        with tempfile.TemporaryDirectory(
            prefix=".posbench-write-test-", dir=existing, ignore_cleanup_errors=True
        ) as scratch:
            # the missing part of the path, made under the scratch folder: a name the file system refuses shows
            probe = Path(scratch).joinpath(*missing)
            probe.mkdir(parents=True, exist_ok=True)
            (probe / "probe").write_bytes(b"")
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write {path} ({e.strerror}); choose a folder you can write") from None
    return path


def _deepest_existing(path: Path) -> tuple[Path, tuple[str, ...], bool]:
    """The deepest ancestor of ``path`` (itself included) that exists, the names below it that do not, and
    whether it is a folder: one ``stat`` per level, so a folder removed between two looks reads as missing,
    never as a file."""
    for depth, p in enumerate((path, *path.parents)):
        try:
            mode = p.stat().st_mode
        except OSError:  # missing, below a file, a name too long: found higher up, refused by the probe
            continue
        return p, path.parts[len(path.parts) - depth :], stat.S_ISDIR(mode)
    raise AssertionError("the root always exists")


def number(annotation: Any, kind: type = float):
    """An argparse ``type=`` for a flag whose value must be finite and fit ``annotation``'s declared range."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number")
        bad = violated(value, annotation)
        if bad:
            raise argparse.ArgumentTypeError(f"{text} {bad.must}")
        return value

    return parse
