"""Files beside a config's checkpoints: the run link, the lock, the committed checkpoints.

Layout: ``<checkpoint root>/<config_hash>/`` holds ``run.json`` (the MLflow run training this config,
a ``RunLink``), ``lock`` (a ``DirLock``, held while a process trains it) and ``step-<k>.ckpt`` (the
last committed checkpoint, written by harness/record/callbacks.py) with ``step-<k>.ckpt.sha256``, its digest
taken as it was written (harness/integrity.py): a checkpoint whose bytes changed since (a bad disk, a copy cut
short, an edit) is refused at resume instead of resumed. Why a resumed run equals an
uninterrupted one, and why no metric point is written twice or lost, is in harness/record/resume.py.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from harness import integrity
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
        integrity.write(directory / LINK, asdict(self))

    @classmethod
    def load(cls, directory: Path) -> RunLink | None:
        path = directory / LINK
        if not path.exists():
            return None
        fix = f"delete {directory} to start this config afresh (its checkpoints cannot be tied to a run)"
        record = integrity.read(path, fix, keys=(f.name for f in fields(cls)))
        try:
            return cls(**{k: str(record[k]) for k in ("run_id", "config_hash", "tracking_uri", "experiment")})
        except KeyError as e:
            raise ConfigError(f"{path} is damaged (no {e}); {fix}") from None


class DirLock:
    """An exclusive flock: the kernel drops it when its holder dies, even by SIGKILL, so a held
    lock means a live process is training this config and a free one means nobody is."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

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
    integrity.check_file(
        path, f"delete it and its {integrity.FILE_SEAL} to resume from an earlier checkpoint, or drop resume="
    )
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except Exception as e:
        why = " ".join(str(e).split()).split(". ")[0]  # torch's first sentence; the rest is advice
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
