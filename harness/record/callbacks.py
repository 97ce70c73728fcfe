"""Lightning → the run record: the logger that writes metric points through the run, and the callbacks of exact
resume: RNG states in the checkpoint, checkpoints committed only after the points before them reached the store
(harness/record/resume.py says why).

Each sqlite write is a committed transaction, so per-point logging would dominate a small CPU run: ``RunLogger``
buffers points and writes them in batches. The MLflow step of a point is the number of optimizer steps completed
(Lightning's own step argument lags by one in places), read from the trainer by ``StepClock``. A resumed run
recomputes the steps after its checkpoint, some of which a killed process may already have written; MLflow cannot
delete single points, so only steps beyond ``TrackedRun.logged_through`` are written (docs/robustness.md).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from harness import integrity
from harness.record.run import TrackedRun
from harness.signals import STOPPED_AT


class RngState(L.Callback):
    """Global RNG states (dropout draws from them) saved in, and restored from, the checkpoint."""

    def state_dict(self) -> dict[str, Any]:
        legacy = np.random.get_state(legacy=True)  # numpy's stub types the call without ``legacy`` as a dict
        assert isinstance(legacy, tuple), "numpy's global RandomState is MT19937, whose legacy state is a tuple"
        kind, keys, pos, has_gauss, gauss = legacy
        state = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": {
                "kind": kind,
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "gauss": float(gauss),
            },
        }
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
    """Every ``every`` optimizer steps (0: never): save after the step (Lightning's own restart point),
    commit at the start of the next one, once the logger has flushed every point up to it. ``start``: the step
    of the checkpoint this run resumed from (0: none). A run trains with ``RngState`` beside it."""

    def __init__(self, directory: Path, every: int, flush: Callable[[], None], start: int = 0):
        self.dir, self.every, self.flush = directory, every, flush
        self._saved_step = -1
        self._pending: int | None = None
        self._committed = start  # the step of the last committed checkpoint, or the one resumed from (0: none)
        self._step_before = 0  # global_step as the current batch started
        self._stepped = False  # the last batch ended an optimizer step (not a micro-batch of accumulation)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # not due, or a further micro-batch of gradient accumulation: no save
        self._stepped = step != self._step_before
        if self.every and not (step == 0 or step % self.every or step == self._saved_step):
            self._save(trainer, step)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._step_before = trainer.global_step
        self._commit(trainer)

    def on_train_end(self, trainer, module) -> None:
        self._commit(trainer)

    def on_exception(self, trainer, module, exception: BaseException) -> None:
        """Stopped. SIGTERM: Lightning raises at the end of a batch; one that ended an optimizer step is a clean
        point, so that step is saved (unless checkpoints are off: every 0). Ctrl-C may land anywhere (inside an
        optimizer step): only the last whole checkpoint is committed, as for a SIGTERM after a micro-batch of
        gradient accumulation (a checkpoint there holds neither the step before nor the one after). A stop inside
        step k's validation commits no checkpoint of step k: Lightning resumes a step-k checkpoint past that
        validation, so its points would never be written."""
        if not isinstance(exception, (SystemExit, KeyboardInterrupt)):
            return  # a crash: the last committed checkpoint stays the one to resume
        step = trainer.global_step
        if trainer.validating and trainer.state.fn == "fit":  # stopped inside fit's validation of this step
            self._pending = None
            if trainer.is_global_zero:
                for dropped in (self.dir / "pending.ckpt", integrity.seal_path(self.dir / "pending.ckpt")):
                    dropped.unlink(missing_ok=True)
        elif isinstance(exception, SystemExit) and self.every and self._stepped and step != self._saved_step:
            self._save(trainer, step)
        self._commit(trainer)
        STOPPED_AT["step"] = self._committed  # for the one line that says so (0: no checkpoint yet)

    def _save(self, trainer, step: int) -> None:
        self._saved_step = step
        tmp = self.dir / "pending.ckpt.tmp"
        trainer.save_checkpoint(tmp)  # every rank calls it; the strategy writes on rank 0
        if trainer.is_global_zero:
            os.replace(tmp, self.dir / "pending.ckpt")  # atomic: a kill mid-write leaves no torn file
            integrity.seal_file(self.dir / "pending.ckpt")  # what resume checks the bytes against
        self._pending = step  # every rank: each one's stop line names the step rank 0 commits

    def _commit(self, trainer) -> None:
        if self._pending is None:
            return
        if trainer.is_global_zero:
            self.flush()  # step k's points and its validation are in the store before step k is resumable
            final = self.dir / f"step-{self._pending}.ckpt"
            os.replace(integrity.seal_path(self.dir / "pending.ckpt"), integrity.seal_path(final))  # sealed by _save
            os.replace(self.dir / "pending.ckpt", final)
            for old in [*self.dir.glob("step-*.ckpt"), *self.dir.glob(f"step-*.ckpt{integrity.FILE_SEAL}")]:
                if old not in (final, integrity.seal_path(final)):
                    old.unlink(missing_ok=True)
        self._committed, self._pending = self._pending, None


# ---------------------------------------------------------------- the logger


class StepClock(L.Callback):
    """Optimizer steps completed, as the trainer that runs this callback counts them."""

    _trainer: L.Trainer | None = None  # until Lightning calls setup

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer

    @property
    def step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0


class RunLogger(Logger):
    def __init__(self, run: TrackedRun, clock: StepClock, flush_points: int = 500, flush_seconds: float = 15.0):
        super().__init__()
        self.run, self.clock = run, clock
        self.flush_points, self.flush_seconds = flush_points, flush_seconds
        self._buffer: list = []
        self._last_flush = time.monotonic()

    @property
    def name(self) -> str:
        return "mlflow"

    @property
    def version(self) -> str:
        return self.run.run_id or ""

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass  # the flattened resolved config is logged when the run is created

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), self.clock.step
        self._buffer.extend(
            Metric(k, float(v), now, step)
            for k, v in metrics.items()
            if k != "epoch" and step > self.run.logged_through.get(k, -1)
        )
        if len(self._buffer) >= self.flush_points or time.monotonic() - self._last_flush > self.flush_seconds:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        self.run.log_metrics(self._buffer)
        self._buffer.clear()
        self._last_flush = time.monotonic()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.flush()  # the run's status is the TrackedRun's to set, which also sees crashes outside fit
