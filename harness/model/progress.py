"""How a run shows its progress: a live bar in a terminal, a few plain lines in a log file.

A progress bar redraws itself with carriage returns, which a terminal overwrites but a redirected
log (CI, SLURM, ``nohup``) keeps: a TQDM bar writes several '\\r' refreshes a step. So
``trainer.progress=auto`` (the default) keeps Lightning's bar when stdout is a terminal (its rich bar
where ``rich`` imports, else TQDM, as Lightning itself picks) and otherwise prints ``ProgressLines``:
one line every ``trainer.progress_every_n_steps`` optimizer steps and one at each validation, nothing
per batch. ``trainer.enable_progress_bar=false`` still shows nothing.

A redirected run also drops Lightning's one-time INFO banners (GPU/TPU availability, a LitLogger tip,
"fit stopped"), which say nothing about the run; its warnings stay (``LIGHTNING_INFO_LOGGERS``).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
import warnings
from typing import TextIO

from lightning.pytorch.callbacks import Callback, ProgressBar, RichProgressBar, TQDMProgressBar

# Where Lightning's rank_zero_info writes (lightning/{pytorch,fabric}/utilities/rank_zero.py).
LIGHTNING_INFO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.trainer.connectors.checkpoint_connector",
)  # `weights_only` notes


def progress_callbacks(mode: str, every: int, enabled: bool = True, stream: TextIO | None = None) -> list[Callback]:
    """The progress callback for ``trainer.progress`` (auto | bar | lines), or none when
    ``trainer.enable_progress_bar`` is false. auto: a bar if ``stream`` (stdout) is a terminal, else lines."""
    tty = bool(getattr(stream or sys.stdout, "isatty", lambda: False)())
    quiet_lightning_pytree()
    if not tty:  # Lightning's INFO lines off, WARNING and above kept (its docs: "Configure console logging")
        for name in LIGHTNING_INFO_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    if not enabled:
        return []
    if mode == "auto":
        mode = "bar" if tty else "lines"
    if mode == "lines":
        return [ProgressLines(every, stream)]
    return [RichProgressBar() if rich_available() else TQDMProgressBar()]


def rich_available() -> bool:
    return importlib.util.find_spec("rich") is not None


def quiet_lightning_pytree() -> None:
    """Lightning 2.6 builds torch's deprecated ``LeafSpec`` on every batch transfer: a FutureWarning per process
    that no posbench setting can act on (torch/utils/_pytree.py). Only that warning, only from that module."""
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module="lightning.pytorch.utilities._pytree",
    )


def clock(seconds: float) -> str:
    """H:MM:SS."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class ProgressLines(ProgressBar):
    """Plain progress lines: ``train`` every ``every`` optimizer steps, ``val`` after each validation.

    A step's train line waits until the next step starts: when a validation runs at that step, its
    ``val`` line (which carries the same numbers and the new val loss) replaces it.
    """

    def __init__(self, every: int, stream: TextIO | None = None):
        super().__init__()
        self.every, self.stream = every, stream or sys.stdout
        self._enabled, self._last = True, -1
        self._pending: str | None = None  # a train line held to the next batch (a val line replaces it)
        self._t0, self._step0 = time.perf_counter(), 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer, pl_module):
        self._t0, self._step0 = time.perf_counter(), trainer.global_step  # a resumed run starts past 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._flush()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step  # already counts this batch's optimizer step, if it made one
        if step != self._last and step % self.every == 0:
            self._last, self._pending = step, self.line("train", trainer)

    def on_train_end(self, trainer, pl_module):
        self._flush()

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._pending = None  # this step's train line, if any: the val line says the same and more
            self._write(self.line("val", trainer))

    def line(self, kind: str, trainer) -> str:
        m = trainer.callback_metrics
        step, total = trainer.global_step, trainer.max_steps
        done, elapsed = step - self._step0, time.perf_counter() - self._t0
        eta = clock(elapsed / done * (total - step)) if done > 0 else "—"
        return (
            f"{kind:<5} step {step:>{len(str(total))}}/{total}  loss {_num(m, 'train/loss', 4)}"
            f"  val loss {_num(m, 'val/loss', 4)}  tokens/s {_num(m, 'train/tokens_per_s', 0, ',')}"
            f"  elapsed {clock(elapsed)}  ETA {eta}"
        )

    def _flush(self) -> None:
        if self._pending is not None:
            self._write(self._pending)
            self._pending = None

    def _write(self, text: str) -> None:
        if self._enabled:
            self.stream.write(text + "\n")
            self.stream.flush()  # a redirected stdout is block-buffered: `tail -f` should see each line


def _num(metrics: dict, key: str, digits: int, sep: str = "") -> str:
    value = metrics.get(key)
    return "—" if value is None else f"{float(value):{sep}.{digits}f}"
