"""Exact resume: checkpoints keyed by a hash of the config, the same MLflow run reopened.

The checkpoint root is ``checkpoint.dir``, else ``checkpoints/`` beside the sqlite store (so a test's
temporary store keeps its checkpoints to itself), else ``<project root>/checkpoints``; each config
trains in ``<root>/<config_hash>/``, which holds ``run.json`` (the MLflow run training this config, a
``RunLink``), ``lock`` (``_dir_lock``, held while a process trains it) and ``step-<k>.ckpt`` (the last committed
checkpoint, written by harness/record/callbacks.py) with ``step-<k>.ckpt.sha256``, its digest taken as it was
written (harness/integrity.py): a checkpoint whose bytes changed since (a bad disk, a copy cut short, an edit) is
refused at resume instead of resumed.

Why a resumed run equals an uninterrupted one (CPU, fixed seed):
- weights, optimizer, LR scheduler and loop counters: Lightning's checkpoint (``ckpt_path``);
- data: every example is a pure function of (seed, index) and the sampler continues at
  example ``global_step × batch × accumulation`` (``harness.data.windows.ContinueFrom``);
- dropout: the torch/numpy/python (and CUDA) RNG states travel in the checkpoint
  (``RngState``, harness/record/callbacks.py); data loaders draw from their own generator, so
  evaluation consumes no global randomness that an interrupted run would skip.

Why no metric point is written twice or lost:
- a checkpoint saved after step k is *committed* (renamed to ``step-k.ckpt``) only at the start
  of step k+1, after the logger's buffer — step k's points and its validation — reached the
  store; a crash before that leaves the previous checkpoint as the one to resume;
- points after the checkpoint may also have reached the store before a crash (the logger
  flushes by size and time). MLflow cannot delete single points, so a resumed run logs only
  steps beyond the last step stored for each metric (``TrackedRun.logged_through``): those
  recomputed points have the same values as the stored ones.
"""

from __future__ import annotations

import fcntl
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness import integrity
from harness.errors import ConfigError, one_line
from harness.integrity import RecordDamaged, check_writable_dir, warn
from harness.paths import project_root
from harness.record.run import close_dead_runs, close_stale_runs
from harness.record.store import Store, sqlite_path

# Keys that change neither what is computed nor where it is logged.
VOLATILE = ("resume", "checkpoint", "hydra", "claim", "progress", "report")  # claim, report: judging; progress: display
VOLATILE_TRAINER = ("enable_progress_bar",)


# ---------------------------------------------------------------- the files beside a config's checkpoints

LINK = "run.json"


@dataclass
class RunLink:
    """Which MLflow run trains the config whose checkpoints sit in this directory."""

    run_id: str
    config_hash: str
    tracking_uri: str
    experiment: str

    def save(self, directory: Path) -> None:
        integrity.write(directory / LINK, asdict(self))

    @classmethod
    def load(cls, directory: Path) -> RunLink | None:
        return integrity.read_fields(
            directory / LINK,
            cls,
            f"delete {directory} to start this config afresh (its checkpoints cannot be tied to a run)",
        )


@contextmanager
def _dir_lock(path: Path) -> Iterator[bool]:
    """An exclusive flock on ``path``, held for the ``with`` block; yields whether it was free. The kernel drops
    it when its holder dies, even by SIGKILL, so a held lock means a live process is training this config and a
    free one means nobody is."""
    with open(path, "w") as lock:  # closing drops the flock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def latest_checkpoint(directory: Path) -> Path | None:
    return max(directory.glob("step-*.ckpt"), key=lambda p: int(p.stem.split("-")[1]), default=None)


def checkpoint_step(path: Path) -> int:
    integrity.check_file(
        path, f"delete it and its {integrity.FILE_SEAL} to resume from an earlier checkpoint, or drop resume="
    )
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except Exception as e:
        why = one_line(e).split(". ")[0]  # torch's first sentence; the rest is advice
        raise ConfigError(
            f"resume: checkpoint {path} is corrupt or truncated ({type(e).__name__}: {why}); delete it "
            "to resume from an earlier one, or drop resume="
        ) from None


def remove_checkpoints(directory: Path) -> None:
    for path in [
        *directory.glob("step-*.ckpt"),
        *directory.glob(f"step-*.ckpt{integrity.FILE_SEAL}"),
        *directory.glob("pending.ckpt*"),
    ]:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- the plan


def config_hash(values: dict, uri: str) -> str:
    """sha256 of the resolved config ``values`` minus volatile keys, plus the store it is logged to."""
    resolved = {k: v for k, v in values.items() if k not in VOLATILE}
    resolved["trainer"] = {k: v for k, v in resolved["trainer"].items() if k not in VOLATILE_TRAINER}
    return integrity.sha256(json.dumps({"config": resolved, "tracking_uri": uri}, sort_keys=True, default=str))[:16]


def _checkpoint_root(values: dict, uri: str) -> Path:
    configured = values["checkpoint"]["dir"]
    if configured:
        return Path(str(configured)).expanduser().absolute()
    db = sqlite_path(uri)
    return (db.parent if db else project_root()) / "checkpoints"


@dataclass
class ResumePlan:
    """What to resume, decided before any run exists; owns the config's lock while training."""

    config_hash: str
    dir: Path
    every: int  # checkpoint every N optimizer steps; 0: never
    uri: str  # the tracking store, opened only when the plan reads or closes runs
    experiment: str
    run_id: str | None = None  # the run to reopen; None: a new run
    ckpt: Path | None = None
    step: int = 0  # optimizer steps already done

    @property
    def store(self) -> Store:
        return Store.open(self.uri)

    @property
    def tags(self) -> dict[str, str]:
        return {"config_hash": self.config_hash, **({"resumed_from_step": str(self.step)} if self.ckpt else {})}

    @contextmanager
    def session(self, owner: bool = True) -> Iterator[ResumePlan]:
        """Hold the config's lock while training; a clean end deletes the checkpoints. Only the
        owner (global rank 0) does either: the other DDP ranks train the same config at once."""
        if not owner:
            yield self
            return
        self.dir.mkdir(parents=True, exist_ok=True)  # checked writable by plan_resume, made when a run trains
        with _dir_lock(self.dir / "lock") as free:
            if not free:
                raise ConfigError(
                    f"another process is training this same config now (lock {self.dir / 'lock'}); "
                    "wait for it to finish, or change the config (e.g. seed=)"
                )
            close_stale_runs(
                self.store,
                self.experiment,
                self.config_hash,
                keep=self.run_id,
                by="a new run of the same config" if self.run_id is None else "its resume",
            )
            close_dead_runs(self.store, self.experiment, keep=self.run_id)  # any config, this host
            if self.run_id is None:
                remove_checkpoints(self.dir)  # a new run must never resume another run's state
            else:
                warnings.filterwarnings(  # ContinueFrom continues the epoch at global_step × batch
                    "ignore", message="You're resuming from a checkpoint that ended before the epoch ended"
                )
            yield self
            remove_checkpoints(self.dir)  # FINISHED: nothing left to resume

    def link(self, run_id: str | None) -> None:
        """Record the run beside its checkpoints (rank 0, once the run is open)."""
        if run_id:
            RunLink(run_id, self.config_hash, self.uri, self.experiment).save(self.dir)


def plan_resume(values: dict, uri: str, mode: str | Path) -> ResumePlan:
    """Find what to resume; ``mode`` is "new", "require", "auto" or a checkpoint path (the validated
    ``resume``). Writes nothing to MLflow except, for a refused ``resume=true``, closing this config's
    stale runs."""
    h = config_hash(values, uri)
    every = values["checkpoint"]["every_n_steps"] or 0  # null: off
    plan = ResumePlan(h, _checkpoint_root(values, uri) / h, every, uri, values["logger"]["experiment"])
    check_writable_dir(plan.dir, "checkpoint.dir", "set checkpoint.dir to a directory you can write")
    if mode == "new":
        return plan
    ckpt, link = _checkpoint_and_link(mode, plan)
    run = None
    if link:
        try:
            found = plan.store.client.get_run(link.run_id)
        except RecordDamaged as e:  # resume=auto (a sweep's cells) starts anew; resume=true refuses in its line
            if mode != "auto":
                raise
            warn(e, "this cell trains again")
        except Exception:  # deleted, or a different store: no run to reopen
            pass
        else:
            run = found if found.info.lifecycle_stage == "active" else None
    if ckpt is not None and run is not None and run.info.status != "FINISHED":
        plan.run_id, plan.ckpt, plan.step = run.info.run_id, ckpt, checkpoint_step(ckpt)
    elif mode != "auto":
        _refuse(plan, run, ckpt, linked=link is not None)
    return plan


def _checkpoint_and_link(mode: str | Path, plan: ResumePlan) -> tuple[Path | None, RunLink | None]:
    if not isinstance(mode, Path):
        return latest_checkpoint(plan.dir), RunLink.load(plan.dir)
    if not mode.is_file():
        raise ConfigError(f"resume={mode}: no such checkpoint; use resume=true for this config's latest one")
    checkpoint_step(mode)  # a corrupt or truncated file is named so, whoever wrote it
    link = RunLink.load(mode.parent)
    if link is None:
        raise ConfigError(
            f"resume={mode}: no {LINK} beside it, so which config wrote it is unknown; "
            "resume from the checkpoints/<hash>/ folder it was written in"
        )
    if link.config_hash != plan.config_hash:
        raise ConfigError(
            f"resume={mode} was written by another config (hash {link.config_hash}, this one is "
            f"{plan.config_hash}); resume with the overrides it was trained with"
        )
    return mode, link


def _refuse(plan: ResumePlan, run, ckpt: Path | None, linked: bool) -> None:
    """Why there is nothing to resume; a run of this config left RUNNING by a dead process is closed
    first (only a config that ever opened a run has a link file, so only then is the store read)."""
    if run is not None and run.info.status == "FINISHED":
        raise ConfigError(
            f"resume=true: run {run.info.run_id} of this config already FINISHED; nothing to resume "
            "(drop resume=true to train it again)"
        )
    if linked:
        with _dir_lock(plan.dir / "lock") as free:
            if free:  # nobody trains it: a RUNNING run of this config is a dead process's
                close_stale_runs(plan.store, plan.experiment, plan.config_hash, keep=None, by="resume=true")
    why = "its MLflow run is gone" if ckpt is not None else "no checkpoint"
    raise ConfigError(
        f"resume=true: {why} for this config under {plan.dir}; run without resume=true "
        f"(checkpoints are written every checkpoint.every_n_steps={plan.every} steps)"
    )
