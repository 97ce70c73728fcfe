"""JSON records the harness writes and reads back, sealed with their own sha256 so damage is one line.

``write(path, record)`` writes ``record`` with a ``sha256`` key over its canonical JSON (sorted keys, no spaces),
atomically (a temporary file renamed over the old one); ``read(path, fix)`` returns the record without it, or raises
a ConfigError naming the file and ``fix`` when the file is not JSON, not an object, or its content no longer matches
its seal (edited, truncated, a flipped byte). A record written before seals (no ``sha256`` key) is read as it is.
Used for the run link beside a run's checkpoints (``run.json``) and a sweep's record (``mlflow_sweep.json``); the
shard manifests (harness/data/shards.py) and vocabularies (harness/data/subword.py) seal themselves the same way.

Ground: imports nothing from the project but its errors.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def read(path: Path, fix: str) -> dict:
    """The record at ``path`` without its seal; a ConfigError naming the file and ``fix`` if it is damaged."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is damaged (not JSON: {' '.join(str(e).split())[:60]}); {fix}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} is damaged (not a JSON object); {fix}")
    if SEAL in record and record[SEAL] != digest(record):
        raise ConfigError(f"{path} is damaged (its content no longer matches its sha256); {fix}")
    return {k: v for k, v in record.items() if k != SEAL}
