"""Lightning → the run record: a logger that buffers metric points and writes them in batches.

Each sqlite write is a committed transaction, so per-point logging would dominate a small CPU run. The MLflow step
of a point is the number of optimizer steps completed (Lightning's own step argument lags by one in
places), read from the trainer by ``StepClock``. A resumed run recomputes the steps after its
checkpoint, some of which a killed process may already have written; MLflow cannot delete single
points, so only steps beyond ``TrackedRun.logged_through`` are written (docs/robustness.md).
"""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from harness.record.run import TrackedRun


class StepClock(L.Callback):
    """Optimizer steps completed, as the trainer that runs this callback counts them."""

    def __init__(self) -> None:
        self._trainer = None

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
        through = self.run.logged_through
        self._buffer.extend(
            Metric(k, float(v), now, step) for k, v in metrics.items() if k != "epoch" and step > through.get(k, -1)
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
