"""Checks on a config's values and paths that run before anything is built or logged.

Each failure is a ConfigError whose message names the key, the bad value and the fix. The
shape checks (heads, RoPE dims, windows) live with the classes that know them; this module
holds what no constructor sees: types of top-level numbers, the tracking URI, writable paths.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError

# Keys that must hold an integer: a string here would surface as a TypeError deep in training.
INT_KEYS = ("seed", "trainer.max_steps", "data.seq_len", "data.batch_size", "model.n_layers",
            "model.d_model", "model.n_heads", "model.d_ff")

# Schemes MLflow 3 can open as a tracking store (``file`` needs MLFLOW_ALLOW_FILE_STORE=true).
SCHEMES = {"sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file"}


def preflight(cfg: DictConfig, uri: str) -> None:
    check_ints(cfg)
    check_tracking_uri(uri)
    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is not None:
        check_writable_dir(db.parent, "logger.tracking_uri", "point it at a directory you can write")


def check_ints(cfg: DictConfig) -> None:
    for key in INT_KEYS:
        value = OmegaConf.select(cfg, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key}={value!r} must be an integer, e.g. {key}={_example(key)}")


def _example(key: str) -> int:
    return {"seed": 0, "trainer.max_steps": 300, "data.seq_len": 128, "data.batch_size": 32}.get(key, 4)


def check_tracking_uri(uri: str) -> None:
    """A URI MLflow cannot open fails here with the fix, not inside MLflow with a traceback."""
    fix = "use sqlite:////absolute/path/mlflow.db or http://host:port (or leave logger.tracking_uri=null)"
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise ConfigError(f"tracking URI {uri!r} has scheme {parsed.scheme!r}, which MLflow cannot open; {fix}")
    if parsed.scheme == "sqlite" and not (uri.startswith("sqlite:////") and len(uri) > len("sqlite:////")):
        raise ConfigError(f"tracking URI {uri!r} is not sqlite:////absolute/path.db (four slashes, absolute); {fix}")
    if parsed.scheme in ("http", "https") and not parsed.netloc:
        raise ConfigError(f"tracking URI {uri!r} names no host; {fix}")


def check_writable_dir(path: Path, key: str, fix: str) -> None:
    """``path`` (created if missing) accepts new files."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{key}: cannot create {path} ({e.strerror}); {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not writable; {fix}")
