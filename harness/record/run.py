"""The one owner of an MLflow run's life, and the only writer of run status and failure tags.

``TrackedRun`` creates its run (or reopens it, to resume) exactly once, writes everything through the
store's one client, and closes it in a ``finally``: FINISHED, KILLED on Ctrl-C / SIGTERM, or FAILED
with tags ``failure`` (incompatible | diverged | error) and a one-line ``failure_reason``. On DDP ranks
other than 0 it is inert: every method does nothing, so no caller needs a rank guard.

``mark_failed`` closes runs whose owner is gone (a SIGKILLed process, a job killed by the OOM killer, power
loss); it lives here so that status writes stay in one module. Two ways to know a RUNNING run is dead, each checked
when a later process starts on the same store:
- ``close_dead_runs``: the run's ``host`` tag is this machine and its ``pid`` no longer exists
  (any run, whatever its config: plain runs, sweep cells, sweep parents);
- ``close_stale_runs``: the run trains the same config (tag ``config_hash``) and the config's lock is
  free — the kernel drops a flock when its holder dies, even by SIGKILL, on any host sharing the
  filesystem.
Both close the run FAILED with ``failure=killed`` and a reason naming who found it.

Contract (reports depend on these names): run name ``pos=<p> attn=<a> seed=<s>``; tags ``pos attn task
data seed git_sha corpus_sha256 host pid``; params = the flattened resolved config; metrics at the
optimizer step. Sweep children also carry ``mlflow.parentRunId`` and ``sweep_id``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from harness.errors import IncompatiblePairing, one_line
from harness.integrity import MARK_TAG, SEAL_TAG, seal
from harness.paths import ROOT, in_checkout
from harness.record.store import Store, check_whole
from harness.signals import held

# Exception type -> ``failure`` tag; anything else is "error" (a bad value such as lr=-1 is
# the user's mistake, not a cell the grid excludes). FloatingPointError is a NaN/inf loss.
FAILURE_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (IncompatiblePairing, "incompatible"),
    (FloatingPointError, "diverged"),
)
BATCH = {"params": 100, "metrics": 1000, "tags": 100}  # MLflow's limits per log_batch call

WINDOWS_ARTIFACT = "val_windows.json"  # the final validation per window: {"loss_sum": [...], "tokens": [...]}


def failure_tags(exc: BaseException) -> dict[str, str]:
    """``failure`` and ``failure_reason`` for an exception, looking through its cause chain (Hydra's
    instantiate wraps what a constructor raises)."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    kind, cause = next(((name, e) for e in chain for cls, name in FAILURE_KINDS if isinstance(e, cls)), ("error", exc))
    # one line, for the runs table
    return {"failure": kind, "failure_reason": one_line(f"{type(cause).__name__}: {cause}")[:1000]}


def git_sha() -> str:
    """The checkout's commit (``-dirty`` with local edits); an installed copy names its version instead: git run
    from site-packages would describe whatever repository holds the virtual environment."""
    if not in_checkout():
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"installed {version('posbench')}"
        except PackageNotFoundError:
            return "unknown"
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
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


class TrackedRun:
    """One MLflow run of ``experiment`` in the store at ``uri``, named ``name``; ``tags`` are added
    when it starts (a sweep cell's parent and sweep id). Nothing is read or written before ``start``."""

    def __init__(self, uri: str, experiment: str, name: str, tags: dict[str, str] | None = None):
        self.uri, self.experiment, self.name = uri, experiment, name
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        self.owner = True  # False on DDP ranks other than 0: then every method does nothing
        self.closed = False
        # per metric, the last step already in the store when a run is reopened (see record/callbacks.py)
        self.logged_through: dict[str, int] = {}

    @property
    def store(self) -> Store:
        return Store.open(self.uri)

    @property
    def experiment_id(self) -> str:
        return self.store.experiment_id(self.experiment)

    @property
    def opened(self) -> bool:
        return self.run_id is not None  # only the owner (rank 0) ever opens it

    # ------------------------------------------------------------ life

    @contextmanager
    def open(
        self, tags: dict[str, str], params: dict[str, str], reopen: str | None = None, owner: bool = True
    ) -> Iterator[TrackedRun]:
        """Create the run (or reopen run ``reopen``), yield, and close it whatever happens. Only the
        ``owner`` (global rank 0) touches the store."""
        status, failure = "FAILED", None
        try:
            self.start(tags, params, reopen, owner)
            yield self
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C (Lightning turns it into exit(1)), SIGTERM
            status = "KILLED"
            raise
        except Exception as e:
            failure = failure_tags(e)
            raise
        finally:
            self.end(status, failure)

    def start(
        self, tags: dict[str, str], params: dict[str, str], reopen: str | None = None, owner: bool = True
    ) -> None:
        self.owner = owner
        if not owner or self.opened:
            return
        # host and pid say who owns the run: a later start on the same host closes it if that process is gone
        tags = {**tags, **self.tags, "host": socket.gethostname(), "pid": str(os.getpid())}
        with held():  # a stop meanwhile would leave a RUNNING row this object does not know
            if reopen:
                self.run_id = reopen
                self._reopen(tags)
            else:
                self.run_id = self.store.client.create_run(
                    self.experiment_id, run_name=self.name, tags={**tags, MARK_TAG: "1"}
                ).info.run_id
                self.log_params(params)

    def _reopen(self, tags: dict[str, str]) -> None:
        """Back to RUNNING, without the failure tags of the attempt that died; params were logged
        when it was created."""
        from mlflow.entities import RunTag

        client = self.store.client
        run = client.get_run(self.run_id)  # checked against its seal; written again, it is sealed when it closes
        for key in ("failure", "failure_reason", SEAL_TAG):
            if key in run.data.tags:
                client.delete_tag(self.run_id, key)
        client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        client.update_run(self.run_id, status="RUNNING")
        self.logged_through = {
            key: max(m.step for m in client.get_metric_history(self.run_id, key)) for key in run.data.metrics
        }

    def end(self, status: str, failure: dict[str, str] | None = None) -> None:
        """Close the run once: FINISHED, KILLED, or FAILED with ``failure`` tags (``failure_tags``)."""
        if self.run_id is None or self.closed:  # never opened here (only the owner opens it), or closed
            return
        self.closed = True
        with held():
            if failure:
                self.set_tags(failure)
            terminate(self.store, self.run_id, status)
        if status == "FINISHED":
            check_whole(self.uri)

    # ------------------------------------------------------------ writes

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        self._write("params", [Param(k, v) for k, v in params.items()])

    def log_metrics(self, metrics: Iterable) -> None:
        """``mlflow.entities.Metric`` points."""
        self._write("metrics", list(metrics))

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.log_metrics(Metric(k, float(v), now, step) for k, v in values.items())

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self._write("tags", [RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def log_files(self, files: Mapping[str, str | bytes], subdir: str | None = None) -> None:
        """Artifacts from memory: name -> text or bytes."""
        if not (self.opened and files):
            return
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                path = Path(tmp) / name
                path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
            self.store.client.log_artifacts(self.run_id, tmp, subdir)

    def log_dir(self, directory: str | Path) -> None:
        if self.opened:
            self.store.client.log_artifacts(self.run_id, str(directory))

    def _write(self, kind: str, items: list) -> None:
        """``items`` of one ``kind`` (params, metrics or tags), in batches of MLflow's limit."""
        if self.opened:
            for i in range(0, len(items), BATCH[kind]):
                self.store.client.log_batch(self.run_id, **{kind: items[i : i + BATCH[kind]]})


def mark_failed(store: Store, run_id: str, kind: str, reason: str) -> None:
    """Close a run whose owner is gone: FAILED with ``failure=kind`` and the reason."""
    store.client.set_tag(run_id, "failure", kind)
    store.client.set_tag(run_id, "failure_reason", reason[:1000])
    terminate(store, run_id, "FAILED")


def terminate(store: Store, run_id: str, status: str) -> None:
    """Close run ``run_id`` with ``status`` and seal its record (harness/integrity.py)."""
    store.client.set_terminated(run_id, status=status)
    seal(store.client, run_id)


# ---------------------------------------------------------------- runs whose process died

KILLED_REASON = (
    "the process training this run died without closing it (SIGKILL, OOM or power loss); "
    "found RUNNING with no live process by {by}"
)


def close_stale_runs(store: Store, experiment: str, config_hash: str, keep: str | None, by: str) -> None:
    """This config's RUNNING runs other than ``keep``. Call only while holding the config's lock,
    i.e. when no live process (on this filesystem) trains it."""
    runs = store.search(experiment, f"tags.config_hash = '{config_hash}' and attributes.status = 'RUNNING'")
    _close([r for r in runs if r.info.run_id != keep], store, by)


def close_dead_runs(store: Store, experiment: str, keep: str | None = None) -> None:
    """RUNNING runs of ``experiment`` owned by a process of this host that no longer exists."""
    host = socket.gethostname()
    dead = [
        r
        for r in store.search(experiment, "attributes.status = 'RUNNING'")
        if r.info.run_id != keep
        and r.data.tags.get("host") == host
        and r.data.tags.get("pid", "").isdigit()
        and not alive(int(r.data.tags["pid"]))
    ]
    _close(dead, store, "a later start on this store (its process is gone)")


def _close(runs: list, store: Store, by: str) -> None:
    for run in runs:
        mark_failed(store, run.info.run_id, "killed", KILLED_REASON.format(by=by))
        print(
            f"reconciled: MLflow run {run.info.run_id} was left RUNNING by a dead process; now FAILED (failure=killed)"
        )


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
