"""The tracking store: where it is, whether it can be opened, and the one client that writes to it.

``resolve_tracking_uri`` picks the store (``logger.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else
``sqlite:///<project root>/mlflow.db``). ``check_store`` says, quickly and without importing MLflow,
whether MLflow could open it (the config room calls it before anything is built). ``Store.open``
gives the process's one retrying client for a URI.
"""

from __future__ import annotations

import fcntl
import os
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from harness.errors import ConfigError
from harness.paths import project_root

# Schemes MLflow 3 can open as a tracking store (``file`` needs MLFLOW_ALLOW_FILE_STORE=true).
SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file")
FIX = "use sqlite:////absolute/path/mlflow.db or http://host:port, or leave the tracking URI unset (the default store)"
SQLITE_MAGIC = b"SQLite format 3\x00"
HTTP_TIMEOUT_S = 3.0


def resolve_tracking_uri(configured: str | None) -> str:
    """logger.tracking_uri if set, else $MLFLOW_TRACKING_URI, else sqlite:///<root>/mlflow.db."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


DASHBOARD = "http://127.0.0.1:5000"  # where dashboard_command serves the UI


def dashboard_command(uri: str) -> str:
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def dashboard_url(experiment_id: str, run_id: str | None = None, search: str | None = None) -> str:
    """The UI page of one run (``run_id``) or of the runs table filtered by ``search`` (sorted by name),
    as ``dashboard_command`` serves it. MLflow 3's UI opens an experiment in its GenAI view (a traces
    overview); ``workflowType=machine_learning`` opens its Model training view, where runs live."""
    query = {"workflowType": "machine_learning"}
    if run_id is None and search:
        query = {"searchFilter": search, "orderByKey": "attributes.run_name", "orderByAsc": "true", **query}
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{DASHBOARD}/#/experiments/{experiment_id}/{page}?{urlencode(query, quote_via=quote)}"


# ---------------------------------------------------------------- checks before anything is opened


def check_store(uri: str) -> None:
    """A store MLflow cannot open fails here, in under HTTP_TIMEOUT_S, with one line naming the fix."""
    try:
        parsed = urlparse(uri)
    except ValueError as e:  # e.g. http://[bad: "Invalid IPv6 URL"
        raise ConfigError(f"tracking URI {uri!r} does not parse as a URI ({e}); {FIX}") from None
    if parsed.scheme not in SCHEMES:
        raise ConfigError(f"tracking URI {uri!r} has scheme {parsed.scheme!r}, which MLflow cannot open; {FIX}")
    if parsed.scheme == "sqlite":
        _check_sqlite(uri)
    elif parsed.scheme in ("http", "https"):
        _check_server(uri, parsed)
    elif parsed.scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
        raise ConfigError(
            f"tracking URI {uri!r} is MLflow's file store, which MLflow 3 refuses unless "
            f"MLFLOW_ALLOW_FILE_STORE=true; {FIX}"
        )


def _check_sqlite(uri: str) -> None:
    db = sqlite_path(uri)
    if db is None or not (uri.startswith("sqlite:////") and len(uri) > len("sqlite:////")):
        raise ConfigError(f"tracking URI {uri!r} is not sqlite:////absolute/path.db (four slashes, absolute); {FIX}")
    if db.is_dir():
        raise ConfigError(
            f"tracking URI {uri!r} names a directory; name a database file inside it, e.g. sqlite:///{db / 'mlflow.db'}"
        )
    if db.is_symlink() and not db.exists():  # sqlite would create nothing there and MLflow retry for minutes
        raise ConfigError(
            f"tracking URI {uri!r} is a link to {os.readlink(db)}, which does not exist; point the "
            "link at the store, or logger.tracking_uri at the store's real path"
        )
    if db.exists():
        _check_database_file(db, uri)
    else:
        check_writable_dir(db.parent, "logger.tracking_uri", "point it at a directory you can write")


def _check_database_file(db: Path, uri: str) -> None:
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise ConfigError(
            f"tracking URI {uri!r}: cannot read {db} ({e.strerror}); give a database you can read and write"
        ) from None
    if head and head != SQLITE_MAGIC:  # an empty file is a database sqlite will initialise
        raise ConfigError(
            f"tracking URI {uri!r}: {db} exists but is not an sqlite database; "
            "point logger.tracking_uri at a new file or an MLflow store"
        )
    damage = damage_of(db)
    if damage:
        raise ConfigError(
            f"tracking URI {uri!r}: {db} is a damaged sqlite database ({damage}); restore it from "
            "a backup, or point the tracking URI at a new file"
        )
    if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"tracking URI {uri!r}: {db} (or its directory) is not writable; give a store you can write")


QUICK_CHECK_MAX_BYTES = 1 << 30  # sqlite's quick_check reads every page: its time grows with the store


def damage_of(db: Path) -> str | None:
    """What is wrong with an sqlite file, or None: its header's page count against its size (a truncated
    copy), then, up to QUICK_CHECK_MAX_BYTES, sqlite's own ``PRAGMA quick_check``."""
    import sqlite3

    with open(db, "rb") as f:
        header = f.read(100)
    size = db.stat().st_size
    if len(header) == 100:
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages, counter, valid_for = (int.from_bytes(header[i : i + 4], "big") for i in (28, 24, 92))
        if pages and counter == valid_for and size < pages * page_size:
            return f"truncated: {size:,} bytes of the {pages * page_size:,} its header counts"
    if size > QUICK_CHECK_MAX_BYTES or not header:
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.OperationalError as e:
        # sqlite_errorname: Python 3.11+ (on 3.10 an error is never taken for a busy store)
        busy = (getattr(e, "sqlite_errorname", None) or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
        return None if busy else str(e)  # a busy store is not a damaged one
    except sqlite3.DatabaseError as e:
        return str(e)
    return None if verdict == "ok" else verdict


def _check_server(uri: str, parsed) -> None:
    if not parsed.hostname:
        raise ConfigError(f"tracking URI {uri!r} names no host; {FIX}")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(f"tracking URI {uri!r} has a malformed port; {FIX}") from None
    health = f"{parsed.scheme}://{parsed.hostname}{f':{port}' if port else ''}{parsed.path.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(health, timeout=HTTP_TIMEOUT_S):  # noqa: S310 (a URI the user gave)
            pass
    except urllib.error.HTTPError:
        pass  # it answered: a server is there (it may guard /health behind auth)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"tracking server {uri} does not answer ({reason}); start it "
            "(mlflow server --host ... --port ...) or use a sqlite store"
        ) from None


def check_writable_dir(path: Path, key: str, fix: str) -> None:
    """``path`` (created if missing) accepts new files."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{key}: cannot create {path} ({e.strerror}); {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not writable; {fix}")


# ---------------------------------------------------------------- the client


class Store:
    """One tracking store and the one retrying MLflow client that reads and writes it."""

    def __init__(self, uri: str, client: Any):
        self.uri, self.client = uri, client

    @staticmethod
    def open(uri: str) -> Store:
        """The process's store for ``uri`` (one client per URI and process)."""
        return _open(uri)

    def experiment_id(self, name: str) -> str:
        """The experiment's id, created (with its artifacts beside a sqlite store) if missing."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        db = sqlite_path(self.uri)
        # artifact roots are resolved against the cwd otherwise, and Hydra may move it
        location = (db.parent / "mlartifacts").as_uri() if db else None
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # another process created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def search(self, experiment: str, where: str, **kwargs) -> list:
        """Runs of ``experiment`` matching the filter ``where``; [] if the experiment does not exist."""
        exp = self.client.get_experiment_by_name(experiment)
        return [] if exp is None else list(self.client.search_runs([exp.experiment_id], where, **kwargs))


@cache
def _open(uri: str) -> Store:
    import logging

    from mlflow.tracking import MlflowClient

    from harness.integrity import SealedClient
    from harness.record.retry import RetryingClient

    # MLflow logs each database error with its traceback, then raises it: the exception is what we report
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    check_store(uri)
    db = sqlite_path(uri)
    if db is None:
        return Store(uri, SealedClient(RetryingClient(MlflowClient(tracking_uri=uri))))
    db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow creates and migrates a new sqlite store when a process first opens it; two processes
    # doing that at once race in its alembic migration ("table _alembic_tmp_... already exists",
    # "expected to match one row"), so they take turns opening it.
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    return Store(uri, SealedClient(RetryingClient(client)))  # two jobs may share one sqlite file
