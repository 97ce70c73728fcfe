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
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.integrity import check_writable_dir
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
    """A folder the command may write, absolute (``check_writable_dir``: nothing is created)."""
    if not str(value).strip():
        raise ConfigError(f"{flag} '' names no folder; give one, e.g. {flag} results/mine/")
    path = Path(value).expanduser().absolute()
    check_writable_dir(path, flag, "choose a folder you can write")
    return path


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
