"""Exact resume: checkpoints keyed by a hash of the config, the same MLflow run reopened.

Layout: ``<checkpoint root>/<config_hash>/`` holds ``run.json`` (the MLflow run training this
config), ``lock`` (held while a process trains it) and ``step-<k>.ckpt`` (the last committed
checkpoint). The root is ``checkpoint.dir``, else ``checkpoints/`` beside the sqlite store (so a
test's temporary store keeps its checkpoints to itself), else ``<project root>/checkpoints``.

Why a resumed run equals an uninterrupted one (CPU, fixed seed):
- weights, optimizer, LR scheduler and loop counters: Lightning's checkpoint (``ckpt_path``);
- data: every example is a pure function of (seed, index) and the sampler continues at
  example ``global_step × batch × accumulation`` (``harness.data.windows.ContinueFrom``);
- dropout: the torch/numpy/python (and CUDA) RNG states travel in the checkpoint
  (``RngState``); data loaders draw from their own generator, so evaluation consumes no global
  randomness that an interrupted run would skip.

Why no metric point is written twice or lost:
- a checkpoint saved after step k is *committed* (renamed to ``step-k.ckpt``) only at the start
  of step k+1, after the logger's buffer — step k's points and its validation — reached the
  store; a crash before that leaves the previous checkpoint as the one to resume;
- points after the checkpoint may also have reached the store before a crash (the logger
  flushes by size and time). MLflow cannot delete single points, so a resumed run logs only
  steps beyond the last step stored for each metric (``MlflowTracker.through``): those recomputed
  points have the same values as the stored ones.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import socket
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from harness.config.validate import check_writable_dir
from harness.errors import ConfigError
from harness.record.tracking import MlflowTracker, project_root, sqlite_path

# Keys that change neither what is computed nor where it is logged.
VOLATILE = ("resume", "checkpoint", "hydra", "claim")  # claim: report metadata, not training
VOLATILE_TRAINER = ("enable_progress_bar",)
RECORD = "run.json"
KILLED_REASON = ("the process training this run died without closing it (SIGKILL, OOM or power loss); "
                 "found RUNNING with no live process by {by}")


def config_hash(cfg: DictConfig, uri: str) -> str:
    """sha256 of the resolved config minus volatile keys, plus the store it is logged to."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for key in VOLATILE:
        resolved.pop(key, None)
    for key in VOLATILE_TRAINER:
        resolved.get("trainer", {}).pop(key, None)
    payload = json.dumps({"config": resolved, "tracking_uri": uri}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def checkpoint_root(cfg: DictConfig, uri: str) -> Path:
    configured = OmegaConf.select(cfg, "checkpoint.dir")
    if configured:
        return Path(str(configured)).expanduser().absolute()
    db = sqlite_path(uri)
    return (db.parent if db else project_root()) / "checkpoints"


def resume_mode(value: Any) -> str | Path:
    """``resume``: null/false → "new", true → "require", "auto", or a checkpoint path."""
    if value is None or value is False:
        return "new"
    if value is True:
        return "require"
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, str) and value.endswith(".ckpt"):
        return Path(value).expanduser().absolute()
    raise ConfigError(f"resume={value!r}: use resume=true, resume=auto, resume=false or resume=/path/to/step-K.ckpt")


def checkpoint_every(cfg: DictConfig) -> int:
    every = OmegaConf.select(cfg, "checkpoint.every_n_steps")
    if every is None:
        return 0
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ConfigError(f"checkpoint.every_n_steps={every!r} must be a whole number of steps ≥ 0 (0 or null: off)")
    return every


# ---------------------------------------------------------------- files beside the checkpoints


@dataclass
class RunRecord:
    """Which MLflow run trains the config whose checkpoints sit in this directory."""

    run_id: str
    config_hash: str
    tracking_uri: str
    experiment: str

    def save(self, directory: Path) -> None:
        tmp = directory / f"{RECORD}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(directory / RECORD)

    @classmethod
    def load(cls, directory: Path) -> "RunRecord | None":
        path = directory / RECORD
        return cls(**json.loads(path.read_text())) if path.exists() else None


class DirLock:
    """An exclusive flock: the kernel drops it when its holder dies, even by SIGKILL, so a held
    lock means a live process is training this config and a free one means nobody is."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step-*.ckpt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except Exception as e:
        raise ConfigError(f"resume: cannot read checkpoint {path} ({type(e).__name__}: {e}); "
                          "delete it to resume from an earlier one, or drop resume=") from None


# ---------------------------------------------------------------- the plan, decided before any run exists


@dataclass
class ResumePlan:
    config_hash: str
    dir: Path
    every: int
    uri: str
    experiment: str
    run_id: str | None = None  # the run to reopen; None: a new run
    ckpt: Path | None = None
    step: int = 0  # optimizer steps already done
    _lock: DirLock | None = field(default=None, repr=False)

    @property
    def tags(self) -> dict[str, str]:
        return {"config_hash": self.config_hash, **({"resumed_from_step": str(self.step)} if self.ckpt else {})}

    @contextmanager
    def session(self, owner: bool = True) -> Iterator["ResumePlan"]:
        """Hold the config's lock while training; a clean end deletes the checkpoints. Only the
        owner (global rank 0) does either: the other DDP ranks train the same config at once."""
        if not owner:
            yield self
            return
        self._lock = DirLock(self.dir / "lock")
        if not self._lock.acquire():
            raise ConfigError(f"another process is training this same config now (lock {self._lock.path}); "
                              "wait for it to finish, or change the config (e.g. seed=)")
        try:
            close_stale_runs(self.uri, self.experiment, self.config_hash, keep=self.run_id,
                             by="a new run of the same config" if self.run_id is None else "its resume")
            if self.run_id is None:
                remove_checkpoints(self.dir)  # a new run must never resume another run's state
            yield self
            remove_checkpoints(self.dir)  # FINISHED: nothing left to resume
        finally:
            self._lock.release()

    def attach(self, tracker: MlflowTracker, client, run_id: str) -> None:
        """Point the logger at the run and record the run beside its checkpoints (rank 0 only)."""
        if not run_id:
            return  # a rank other than 0: it neither logs nor owns the checkpoints
        RunRecord(run_id, self.config_hash, self.uri, self.experiment).save(self.dir)
        tracker.client, tracker.run_id = client, run_id
        if self.ckpt is not None:
            warnings.filterwarnings(  # ContinueFrom continues the epoch at global_step × batch
                "ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
            tracker.through = logged_through(client, run_id)  # see the module doc

    def callbacks(self, tracker: MlflowTracker) -> list[L.Callback]:
        saver = [CommittedCheckpoints(self.dir, self.every, tracker.flush)] if self.every else []
        return [RngState(), *saver]

    def first_example(self, effective_batch: int) -> int:
        """The first training example after the checkpoint: step × batch × accumulation × ranks."""
        return self.step * effective_batch


def plan_resume(cfg: DictConfig, uri: str) -> ResumePlan:
    """Validate ``resume`` and ``checkpoint``; find what to resume. Writes nothing to MLflow
    except, for a refused ``resume=true``, closing this config's stale runs."""
    mode = resume_mode(OmegaConf.select(cfg, "resume"))
    h = config_hash(cfg, uri)
    plan = ResumePlan(h, checkpoint_root(cfg, uri) / h, checkpoint_every(cfg), uri, cfg.logger.experiment)
    check_writable_dir(plan.dir, "checkpoint.dir", "set checkpoint.dir to a directory you can write")
    if mode == "new":
        return plan
    ckpt, record = _checkpoint_and_record(mode, plan)
    run = _run_or_none(uri, record.run_id) if record else None
    if ckpt is not None and run is not None and run.info.status != "FINISHED":
        plan.run_id, plan.ckpt, plan.step = run.info.run_id, ckpt, checkpoint_step(ckpt)
    elif mode != "auto":
        _refuse(plan, run, ckpt)
    return plan


def _checkpoint_and_record(mode: str | Path, plan: ResumePlan) -> tuple[Path | None, RunRecord | None]:
    if not isinstance(mode, Path):
        return latest_checkpoint(plan.dir), RunRecord.load(plan.dir)
    if not mode.is_file():
        raise ConfigError(f"resume={mode}: no such checkpoint; use resume=true for this config's latest one")
    record = RunRecord.load(mode.parent)
    if record is None or record.config_hash != plan.config_hash:
        raise ConfigError(f"resume={mode} was written by another config (hash "
                          f"{record.config_hash if record else 'unknown'}, this one is {plan.config_hash}); "
                          "resume with the overrides it was trained with")
    return mode, record


def _refuse(plan: ResumePlan, run, ckpt: Path | None) -> None:
    if run is not None and run.info.status == "FINISHED":
        raise ConfigError(f"resume=true: run {run.info.run_id} of this config already FINISHED; nothing to resume "
                          "(drop resume=true to train it again)")
    lock = DirLock(plan.dir / "lock")
    if lock.acquire():  # nobody trains it: a RUNNING run of this config is a dead process's
        try:
            close_stale_runs(plan.uri, plan.experiment, plan.config_hash, keep=None, by="resume=true")
        finally:
            lock.release()
    why = "its MLflow run is gone" if ckpt is not None else "no checkpoint"
    raise ConfigError(f"resume=true: {why} for this config under {plan.dir}; run without resume=true "
                      f"(checkpoints are written every checkpoint.every_n_steps={plan.every} steps)")


def _run_or_none(uri: str, run_id: str):
    from harness.record.tracking import _client

    try:
        run = _client(uri).get_run(run_id)
    except Exception:  # deleted, or a different store
        return None
    return run if run.info.lifecycle_stage == "active" else None


def remove_checkpoints(directory: Path) -> None:
    for path in [*directory.glob("step-*.ckpt"), *directory.glob("pending.ckpt*")]:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- MLflow side


def reopen_run(client, run_id: str, tags: dict[str, str]) -> str:
    """Back to RUNNING, without the failure tags of the attempt that died."""
    from mlflow.entities import RunTag

    stale = [k for k in ("failure", "failure_reason") if k in client.get_run(run_id).data.tags]
    for key in stale:
        client.delete_tag(run_id, key)
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    client.update_run(run_id, status="RUNNING")
    return run_id


def logged_through(client, run_id: str) -> dict[str, int]:
    """Per metric, the last step already in the store."""
    run = client.get_run(run_id)
    return {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}


def mark_killed(client, run_id: str, reason: str) -> None:
    client.set_tag(run_id, "failure", "killed")
    client.set_tag(run_id, "failure_reason", reason[:1000])
    client.set_terminated(run_id, status="FAILED")


def close_stale_runs(uri: str, experiment: str, h: str, keep: str | None, by: str) -> list[str]:
    """FAILED, failure=killed: this config's RUNNING runs, other than ``keep``. Called only while
    holding the config's lock, i.e. when no live process (on this filesystem) trains it."""
    from harness.record.tracking import _client

    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], f"tags.config_hash = '{h}' and attributes.status = 'RUNNING'")
    closed = [r.info.run_id for r in runs if r.info.run_id != keep]
    for run_id in closed:
        mark_killed(client, run_id, KILLED_REASON.format(by=by))
        print(f"reconciled: MLflow run {run_id} was left RUNNING by a dead process; now FAILED (failure=killed)")
    return closed




# ---------------------------------------------------------------- Lightning callbacks


class RngState(L.Callback):
    """Global RNG states (dropout draws from them) saved in, and restored from, the checkpoint."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {"torch": torch.get_rng_state(), "python": random.getstate(),
                 "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                           "has_gauss": int(has_gauss), "gauss": float(gauss)}}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        n = state["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class CommittedCheckpoints(L.Callback):
    """Every ``every`` optimizer steps: save after the step (Lightning's own restart point),
    commit at the start of the next one, once the logger has flushed every point up to it."""

    def __init__(self, directory: Path, every: int, flush):
        self.dir, self.every, self.flush = directory, every, flush
        self._saved_step = -1
        self._pending: int | None = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every or step == self._saved_step:
            return  # not due, or a further micro-batch of gradient accumulation
        self._saved_step = step
        tmp = self.dir / "pending.ckpt.tmp"
        trainer.save_checkpoint(tmp)  # every rank calls it; the strategy writes on rank 0
        if trainer.is_global_zero:
            os.replace(tmp, self.dir / "pending.ckpt")  # atomic: a kill mid-write leaves no torn file
            self._pending = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._commit(trainer)

    def on_train_end(self, trainer, module) -> None:
        self._commit(trainer)

    def _commit(self, trainer) -> None:
        if self._pending is None or not trainer.is_global_zero:
            return
        self.flush()  # step k's points and its validation are in the store before step k is resumable
        final = self.dir / f"step-{self._pending}.ckpt"
        os.replace(self.dir / "pending.ckpt", final)
        for old in self.dir.glob("step-*.ckpt"):
            if old != final:
                old.unlink(missing_ok=True)
        self._pending = None


# ---------------------------------------------------------------- sweeps


def finished_run(cfg: DictConfig, uri: str):
    """The latest FINISHED run of this exact config in the store, or None."""
    from harness.record.tracking import _client

    client = _client(uri)
    exp = client.get_experiment_by_name(cfg.logger.experiment)
    if exp is None:
        return None
    h = config_hash(cfg, uri)
    runs = client.search_runs([exp.experiment_id], f"tags.config_hash = '{h}' and attributes.status = 'FINISHED'",
                              max_results=1, order_by=["attributes.end_time DESC"])
    return runs[0] if runs else None


def adopt(uri: str, run, sweep_tags: dict[str, str]) -> None:
    """Make a FINISHED run a child of the current sweep, remembering its previous parent."""
    from mlflow.entities import RunTag

    from harness.record.tracking import _client

    previous = run.data.tags.get("mlflow.parentRunId")
    tags = {**sweep_tags, **({"adopted_from_parent": previous} if previous else {}),
            "skipped_in_sweep": sweep_tags.get("sweep_id", "")}
    _client(uri).log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def parent_tags() -> dict[str, str]:
    """Who launched a sweep: a later sweep closes the parent if that process is gone."""
    return {"sweep_host": socket.gethostname(), "sweep_pid": str(os.getpid())}


def close_dead_parents(client, experiment_id: str, keep: str) -> list[str]:
    """Sweep parents left RUNNING by a launcher that died (same host, pid gone): FAILED, killed."""
    runs = client.search_runs([experiment_id], "tags.sweep_role = 'parent' and attributes.status = 'RUNNING'")
    dead = [r for r in runs if r.info.run_id != keep and r.data.tags.get("sweep_host") == socket.gethostname()
            and not _alive(int(r.data.tags.get("sweep_pid", "0") or 0))]
    for run in dead:
        mark_killed(client, run.info.run_id, "the sweep's launching process died before the sweep ended; "
                    f"closed by a later sweep at {time.strftime('%Y-%m-%d %H:%M:%S')}")
    return [r.info.run_id for r in dead]


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
