"""Retry MLflow client calls that hit a locked sqlite store.

Two jobs writing one sqlite file (``hydra/launcher=joblib``, or two ``run.py`` at once) take
turns on its single write lock. MLflow sets ``busy_timeout`` (20 s), but SQLite does not wait
for a lock when waiting could deadlock (a read transaction upgrading to a write while another
writer holds the lock): that call fails at once with "database is locked". The transaction was
rolled back, so calling again is safe. Backoff is exponential with full jitter (two writers
that collided should not collide again in lock-step) and bounded, so a store that stays locked
still fails loudly instead of hanging a job.
"""

from __future__ import annotations

import functools
import random
import sys
import time
from collections.abc import Callable
from typing import Any

LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED")  # sqlite's result codes for a store another writer holds


def is_locked(exc: BaseException) -> bool:
    """True if ``exc`` or anything in its cause chain is SQLite's lock error (by its result code, which Python's
    sqlite3 errors carry under MLflow's and SQLAlchemy's)."""
    link: BaseException | None = exc
    for _ in range(10):
        if link is None:
            return False
        if (getattr(link, "sqlite_errorname", None) or "").startswith(LOCKED):
            return True
        link = link.__cause__ or link.__context__
    return False


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
                if not is_locked(e) or i == attempts - 1:
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
