"""Files beside a config's checkpoints, and the Lightning callbacks that write them.

Layout: ``<checkpoint root>/<config_hash>/`` holds ``run.json`` (the MLflow run training this config,
a ``RunLink``), ``lock`` (a ``DirLock``, held while a process trains it) and ``step-<k>.ckpt`` (the
last committed checkpoint). Why a resumed run equals an uninterrupted one, and why no metric point
is written twice or lost, is in harness/record/resume.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from harness.errors import ConfigError

LINK = "run.json"


@dataclass
class RunLink:
    """Which MLflow run trains the config whose checkpoints sit in this directory."""

    run_id: str
    config_hash: str
    tracking_uri: str
    experiment: str

    def save(self, directory: Path) -> None:
        tmp = directory / f"{LINK}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(directory / LINK)

    @classmethod
    def load(cls, directory: Path) -> RunLink | None:
        path = directory / LINK
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


def remove_checkpoints(directory: Path) -> None:
    for path in [*directory.glob("step-*.ckpt"), *directory.glob("pending.ckpt*")]:
        path.unlink(missing_ok=True)


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


