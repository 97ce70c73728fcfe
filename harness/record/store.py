"""The tracking store: where it is, whether it can be opened, and the one client that writes to it.

``resolve_tracking_uri`` picks the store (``logger.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else
``sqlite:///<project root>/mlflow.db``). ``check_store`` says, quickly and without importing MLflow,
whether MLflow could open it (the config room calls it before anything is built); ``check_whole``, whether a
run that closed left an sqlite store whole. ``Store.open`` gives the process's one retrying client for a URI.

Retries: two jobs writing one sqlite file (``hydra/launcher=joblib``, or two ``run.py`` at once) take
turns on its single write lock. MLflow sets ``busy_timeout`` (20 s), but SQLite does not wait
for a lock when waiting could deadlock (a read transaction upgrading to a write while another
writer holds the lock): that call fails at once with "database is locked". The transaction was
rolled back, so calling again is safe. Backoff is exponential with full jitter (two writers
that collided should not collide again in lock-step) and bounded, so a store that stays locked
still fails loudly instead of hanging a job.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode, urlparse

from harness.errors import ConfigError, StoreDamaged, damaged_store_line, exception_chain, one_line
from harness.integrity import SealedClient, check_writable_dir
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
    if not db.exists():
        check_writable_dir(db.parent, "logger.tracking_uri", "point it at a directory you can write")
        return
    try:
        with open(db, "rb") as raw:
            head = raw.read(len(SQLITE_MAGIC))
            damage = damage_of(db, raw) if head == SQLITE_MAGIC else None  # an empty file: sqlite initialises it
    except OSError as e:
        raise ConfigError(
            f"tracking URI {uri!r}: cannot read {db} ({e.strerror}); give a database you can read and write"
        ) from None
    if head and head != SQLITE_MAGIC:
        raise ConfigError(
            f"tracking URI {uri!r}: {db} exists but is not an sqlite database; "
            "point logger.tracking_uri at a new file or an MLflow store"
        )
    if damage:
        raise ConfigError(
            f"tracking URI {uri!r}: {db} is a damaged sqlite database ({damage}); restore it from "
            "a backup, or point the tracking URI at a new file"
        )
    if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"tracking URI {uri!r}: {db} (or its directory) is not writable; give a store you can write")


QUICK_CHECK_MAX_BYTES = 1 << 30  # sqlite's quick_check reads every page: its time grows with the store


def damage_of(db: Path, raw: BinaryIO) -> str | None:
    """What is wrong with an sqlite file, or None: its header's page count against its size (a truncated
    copy), then, up to QUICK_CHECK_MAX_BYTES, sqlite's own ``PRAGMA quick_check``. ``raw`` is the file, opened by
    the caller and kept open while it holds an sqlite lock on the file: closing any descriptor of a file drops every
    POSIX lock the process holds on it (sqlite's own connections put off their close), so a writer could commit
    mid-check."""
    raw.seek(0)
    header = raw.read(100)
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
    except sqlite3.DatabaseError as e:
        # sqlite_errorname: Python 3.11+ (on 3.10 an error is never taken for a busy store)
        return None if _is_locked(e) else str(e)  # a busy store is not a damaged one
    return None if verdict == "ok" else verdict


def check_whole(uri: str) -> None:
    """An sqlite store is read back after a run closes (its header against its size, then sqlite's quick
    check): one truncated or overwritten while the run wrote is taken by sqlite without an error, and the run
    would end 'finished' into a store that no longer opens."""
    db = sqlite_path(uri)
    if db is None or not db.exists():
        return
    try:  # under a shared lock: another cell's writer cannot commit mid-check (its header and size agree)
        with (
            open(db, "rb") as raw,
            contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn,
        ):
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            why = damage_of(db, raw)
            conn.rollback()
    except sqlite3.DatabaseError as e:  # the schema page itself unreadable: damaged; a store kept busy: not
        why = None if _is_locked(e) else one_line(e)
    if why:
        raise StoreDamaged(damaged_store_line(str(db), why))


def _check_server(uri: str, parsed) -> None:
    if not parsed.hostname:
        raise ConfigError(f"tracking URI {uri!r} names no host; {FIX}")
    try:
        port = parsed.port
    except ValueError:
        raise ConfigError(f"tracking URI {uri!r} has a malformed port; {FIX}") from None
    health = f"{parsed.scheme}://{parsed.hostname}{f':{port}' if port else ''}{parsed.path.rstrip('/')}/health"
    try:
        urllib.request.urlopen(health, timeout=HTTP_TIMEOUT_S).close()  # noqa: S310 (a URI the user gave)
    except urllib.error.HTTPError:
        pass  # it answered: a server is there (it may guard /health behind auth)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"tracking server {uri} does not answer ({getattr(e, 'reason', e)}); start it "
            "(mlflow server --host ... --port ...) or use a sqlite store"
        ) from None


# ---------------------------------------------------------------- the client, retrying a locked store

LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED")  # sqlite's result codes for a store another writer holds


def _is_locked(exc: BaseException) -> bool:
    """True if ``exc`` or anything in its cause chain is SQLite's lock error (by its result code, which Python's
    sqlite3 errors carry under MLflow's and SQLAlchemy's)."""
    return any((getattr(link, "sqlite_errorname", None) or "").startswith(LOCKED) for link in exception_chain(exc))


def retry_locked(
    fn: Callable, attempts: int = 10, base: float = 0.05, cap: float = 4.0, sleep: Callable[[float], None] = time.sleep
) -> Callable:
    """``fn`` called again after a locked-store error: at most ``attempts`` calls, sleeping a
    uniform random time in [0, min(cap, base·2^i)] before retry i (~20 s worst case in all)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for i in range(attempts):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if not _is_locked(e) or i == attempts - 1:
                    raise
                delay = random.uniform(0, min(cap, base * 2**i))
                print(
                    f"mlflow store locked ({getattr(fn, '__name__', 'call')}); retry {i + 1} in {delay:.2f} s",
                    file=sys.stderr,
                )
                sleep(delay)

    return call


class RetryingClient:
    """An MlflowClient whose every method retries on a locked store (metric batches, params,
    tags, status, searches: each is one transaction, so each retries alone)."""

    def __init__(self, client: Any):
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_client":
            # unpickling (joblib, submitit ship the sweep callback) looks up __setstate__ & co.
            # before _client exists; delegating those would recurse forever
            raise AttributeError(name)
        attr = getattr(self._client, name)
        return retry_locked(attr) if callable(attr) else attr


class Store:
    """One tracking store and the one retrying MLflow client that reads and writes it."""

    def __init__(self, uri: str, client: Any):
        self.uri, self.client = uri, client

    @staticmethod
    @functools.cache
    def open(uri: str) -> Store:
        """The process's store for ``uri`` (one client per URI and process)."""
        import logging

        from mlflow.tracking import MlflowClient

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
