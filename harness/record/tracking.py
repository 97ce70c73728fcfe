"""MLflow tracking: where the store is, one run's lifecycle, and a buffered Lightning logger.

Contract (reports depend on these names): run name ``pos=<p> attn=<a> seed=<s>``; tags
``pos attn task data seed git_sha corpus_sha256``; params = the flattened resolved config;
metrics ``train/loss val/loss val/bpc train/tokens_per_s lr`` at the optimizer step.
A run that raises ends FAILED with tags ``failure`` (incompatible | diverged | error) and
``failure_reason``; sweep children also carry ``mlflow.parentRunId`` and ``sweep_id``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from harness.errors import IncompatiblePairing

from harness.paths import ROOT, project_root  # noqa: E402


def resolve_tracking_uri(configured: str | None) -> str:
    """logger.tracking_uri if set, else $MLFLOW_TRACKING_URI, else sqlite:///<root>/mlflow.db."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def dashboard_command(uri: str) -> str:
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:6000]  # MLflow's limit on a param value
    return flat


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    from harness.config.validate import check_tracking_uri
    from harness.record.retry import RetryingClient

    check_tracking_uri(uri)
    if urlparse(uri).scheme != "sqlite":
        return RetryingClient(MlflowClient(tracking_uri=uri))
    db = sqlite_path(uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow creates and migrates a new sqlite store when a process first opens it; two processes
    # doing that at once race in its alembic migration ("table _alembic_tmp_... already exists",
    # "expected to match one row"), so they take turns opening it.
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    return RetryingClient(client)  # two jobs may share one sqlite file


def experiment_id(client, name: str, uri: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    db = sqlite_path(uri)
    # artifact roots are resolved against the cwd otherwise, and Hydra may move it
    location = (db.parent / "mlartifacts").as_uri() if db else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


# Exception type -> ``failure`` tag; anything else is "error" (a bad value such as lr=-1 is
# the user's mistake, not a cell the grid excludes). FloatingPointError is a NaN/inf loss.
FAILURE_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (IncompatiblePairing, "incompatible"), (FloatingPointError, "diverged"))


def failure_tags(exc: BaseException) -> dict[str, str]:
    # hydra's instantiate wraps what a constructor raises (InstantiationException): look
    # through the cause chain for the error that says what went wrong
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    kind, cause = next(((name, e) for e in chain for cls, name in FAILURE_KINDS if isinstance(e, cls)),
                       ("error", exc))
    reason = " ".join(f"{type(cause).__name__}: {cause}".split())  # one line, for the runs table
    return {"failure": kind, "failure_reason": reason[:1000]}


@contextmanager
def mlflow_run(uri: str, experiment: str, run_name: str, tags: dict[str, str],
               params: dict[str, str], reopen: str | None = None) -> Iterator[tuple[Any, str]]:
    """Create a run (or reopen run ``reopen`` to resume it); end it FINISHED, or FAILED
    (KILLED on Ctrl-C) if the body raises."""
    from mlflow.entities import Param

    client = _client(uri)
    if reopen:
        from harness.record.resume import reopen_run

        run_id = reopen_run(client, reopen, tags)  # params were logged when it was created
    else:
        run = client.create_run(experiment_id(client, experiment, uri), run_name=run_name, tags=tags)
        run_id = run.info.run_id
    status = "FAILED"
    try:
        items = [] if reopen else [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run_id, params=items[i : i + 100])
        yield client, run_id
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C (Lightning turns it into exit(1)), SIGTERM in a sweep
        status = "KILLED"
        raise
    except Exception as e:
        for key, value in failure_tags(e).items():
            client.set_tag(run_id, key, value)
        e.mlflow_run_id = run_id  # tells a sweep job the failure is already on record
        raise
    finally:
        client.set_terminated(run_id, status=status)


class MlflowTracker(Logger):
    """Lightning logger that buffers metric points and writes them in batches.

    One sqlite write costs ~4 ms, so per-point logging would dominate a small CPU run.
    """

    def __init__(self, client, run_id: str, flush_points: int = 500, flush_seconds: float = 15.0):
        super().__init__()
        self.client, self.run_id = client, run_id
        # MLflow step = optimizer steps completed (Lightning's own step lags by one in places);
        # train() points this at the trainer's global_step.
        self.step_of: Callable[[], int] | None = None
        # per metric, the last step already in the store: a resumed run recomputes the steps after
        # its checkpoint, some of which a killed process may have written (harness/resume.py)
        self.through: dict[str, int] = {}
        self.flush_points, self.flush_seconds = flush_points, flush_seconds
        self._buffer: list = []
        self._last_flush = time.monotonic()

    @property
    def name(self) -> str:
        return "mlflow"

    @property
    def version(self) -> str:
        return self.run_id

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass  # the flattened resolved config is logged when the run is created

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = self.step_of() if self.step_of else (step or 0)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items()
                            if k != "epoch" and step > self.through.get(k, -1))
        if len(self._buffer) >= self.flush_points or time.monotonic() - self._last_flush > self.flush_seconds:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        for i in range(0, len(self._buffer), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=self._buffer[i : i + 1000])
        self._buffer.clear()
        self._last_flush = time.monotonic()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.flush()  # the run's status is set by mlflow_run, which also sees crashes outside fit
