"""The typed schema of every config node, and the check of one value against its declared type.

The rule, for every node of the composed config:
- a node with ``_target_`` is typed by the signature of what it builds: each key must be a parameter
  of that callable and its value must fit the parameter's annotation (``pos=rope`` → ``Rope.__init__``,
  ``optim.optimizer`` → ``torch.optim.AdamW``). Ranges are the callable's own business: our classes
  check them in their constructors (run by the validation pass without allocating anything);
  ``lightning.Trainer`` and torch optimizers get ``TrainerSettings`` / ``OPTIMIZER_RANGES`` here;
- a node without ``_target_`` is typed by the dataclass in ``PLAIN`` for its path, whose
  ``__post_init__`` checks ranges.
Unknown keys are refused with the nearest known one. Floats must be finite. Nothing here imports
torch or Lightning (the Trainer's signature is read only for a key ``TrainerSettings`` does not know).
"""

from __future__ import annotations

import difflib
import inspect
import os
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from harness.errors import ConfigError
from harness.ranges import (  # noqa: F401 (check_value, check_magnitude, fits, describe: re-exported)
    Fraction,
    NonNegative,
    Positive,
    SignificanceLevel,
    _show,
    check_magnitude,
    check_value,
    describe,
    fits,
    violated,
)

NUMERIC_SEED_MAX = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything feeds
MAX_STEPS = 10**12  # trainer.max_steps: a trillion optimizer steps, beyond any run


# ---------------------------------------------------------------- one value against one annotation


# top-level keys posbench once took, and where each went: an old command gets the new spelling, not a list of keys
MOVED = {"arm": "a preset's arms are in its folder now (conf/experiment/<preset>/arm/): +arm=<preset>/<arm> is "
                "+experiment/<preset>/arm=<arm>"}


def check_known(node: str, keys: list[str], known: list[str], what: str) -> None:
    """Every key of ``node`` ("" for the top level) is one ``known`` to its schema; else name the nearest."""
    known = list(dict.fromkeys(known))
    for key in keys:
        if key in known or key.startswith("_"):
            continue
        full = f"{node}.{key}" if node else key
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = MOVED.get(full) or (f"did you mean {f'{node}.' if node else ''}{near[0]}?" if near
                                   else f"{what} takes {', '.join(sorted(known))}")
        raise ConfigError(f"{full} is not a setting of {what}; {hint}")


# ---------------------------------------------------------------- targets: typed by their signature


def signature_schema(target: Any, supplied: tuple[str, ...] = ()) -> tuple[dict[str, Any], bool]:
    """(parameter name -> annotation, accepts **kwargs) of what a ``_target_`` builds, minus the
    parameters the harness supplies itself (``shape``, ``tokenizer``, ``params`` …)."""
    # through @ranged; mypy calls reading a class's __init__ unsound (a subclass may differ): that one is wanted
    fn = inspect.unwrap(target.__init__ if isinstance(target, type) else target)  # type: ignore[misc]
    params = inspect.signature(fn).parameters
    try:
        hints = typing.get_type_hints(fn, include_extras=True)  # Annotated ranges kept
    except Exception:  # annotations that do not evaluate here: check names only
        hints = {}
    schema = {n: hints.get(n, p.annotation if isinstance(p.annotation, type) else Any)
              for n, p in params.items()
              if n not in ("self", *supplied) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return schema, any(p.kind is p.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------- plain nodes: dataclasses


def _positive(key: str, value: int | float | None, allow_none: bool = False, kind: str = "integer") -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigError(f"{key}={value} must be a positive {kind}")


@dataclass(frozen=True)
class RunSettings:
    """Top-level keys of conf/config.yaml that are not config groups."""

    seed: int = 0
    resume: Any = None  # null/false: a new run; true: resume; auto; or a checkpoint path (``resume_mode``)
    claim: dict | None = None  # a paper preset's claim: report metadata (results/paper.py)
    paper: dict | None = None  # a scale=paper file's statement of the paper's setting (harness/config/budget.py)
    scale: dict | None = None  # the scale=toy|paper group: sizes live in conf/experiment/<preset>/scale/
    diagnostics: bool = False  # true: attention diagnostics attached to the run (harness/model/diagnostics.py)
    phases: list = field(default_factory=list)  # positional phases, checked in harness/config/phases.py
    export: Literal["hf"] | None = None  # hf: the final model in transformers' format (harness/pretrained/export.py)

    def __post_init__(self):
        if not 0 <= self.seed <= NUMERIC_SEED_MAX:
            raise ConfigError(f"seed={self.seed} must lie in [0, 2^32 − 1], e.g. seed=0")
        resume_mode(self.resume)

    @property
    def resume_mode(self) -> str | Path:
        return resume_mode(self.resume)


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


@dataclass(frozen=True)
class DataSettings:
    """``data``: the loader keys every source shares, plus the keys some sources read (the corpus
    itself is the ``data.source`` node)."""

    seq_len: int = 128
    batch_size: int = 32
    eval_batches: int | None = None  # None: the whole validation split
    num_workers: int = 0  # training DataLoader worker processes (examples are pure functions of their index)
    path: str | None = None  # data=text, data=enwik8, data=hf, data=tokens
    download: bool = True  # data=enwik8
    name: str | None = None  # data=hf: the hub dataset (the four below too)
    config: str | None = None
    split: str = "train"
    val_split: str | None = None  # null: the training rows split as data.val_by says
    val_by: str = "document"  # data=hf without val_split: document (whole rows) | block (4 KiB blocks)
    text_column: str = "text"
    streaming: bool = False
    max_bytes: int | None = None  # null: the whole split
    windows: str = "random"  # data=tokens: random | sequential training windows
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        _positive("data.seq_len", self.seq_len)
        _positive("data.batch_size", self.batch_size)
        if self.eval_batches is not None and self.eval_batches <= 0:
            raise ConfigError(f"data.eval_batches={self.eval_batches} must be positive, or null for all")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers={self.num_workers} must be ≥ 0 (0: examples made in the training "
                              "process)")
        if self.num_workers > max_workers():
            raise ConfigError(f"data.num_workers={self.num_workers} exceeds {max_workers()} ({WORKERS_PER_CORE} per "
                              f"core of this machine's {os.cpu_count() or 1}): each worker is a process with its own "
                              f"copy of the dataset, and more only fork memory; use at most {max_workers()}")


WORKERS_PER_CORE = 4  # data loader processes: beyond this many per core they add memory, not throughput


def max_workers() -> int:
    """The most data loader worker processes a run may ask for on this machine."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


SOURCE_KEYS = ("path", "download", "name", "config", "split", "val_split", "val_by", "text_column", "streaming",
               "max_bytes", "windows")  # DataSettings keys only some sources read (validate refuses the others)


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: what the final model is scored on beyond the validation split (docs/length-extrapolation.md).
    The keys beyond ``lengths`` are checked against the task and the scheme in validate.py."""

    lengths: list = field(default_factory=list)  # positive ints: score at each length -> val/loss_at_<L>
    stride: int | None = None  # sliding windows advancing S tokens -> val/loss_at_<L>_stride_<S>
    same_targets: int | None = None  # K: the same last K tokens at every length -> val/loss_at_<L>_last_<K>
    position_buckets: int = 8  # loss_by_position.csv/.png: buckets per window
    scalings: list = field(default_factory=list)  # RoPE scalings the trained model is scored under -> val/<s>/...
    finetune_steps: int = 0  # > 0: fine-tune under each scaling, then score -> val/finetuned/<s>/...
    finetune_length: int | None = None  # null: the longest eval length
    finetune_lr: float = 1.0e-4

    @property
    def tune_length(self) -> int | None:
        """The length the fine-tune trains at (eval.finetune_length, else the longest eval length); None: none."""
        return (self.finetune_length or max(self.lengths)) if self.finetune_steps and self.lengths else None

    def __post_init__(self):
        bad = [n for n in self.lengths if isinstance(n, bool) or not isinstance(n, int) or n <= 0]
        if bad:
            raise ConfigError(f"eval.lengths={self.lengths}: {bad} are not positive integers; "
                              "e.g. eval.lengths=[128,256]")
        _positive("eval.stride", self.stride, allow_none=True)
        _positive("eval.same_targets", self.same_targets, allow_none=True)
        _positive("eval.position_buckets", self.position_buckets)
        _positive("eval.finetune_length", self.finetune_length, allow_none=True)
        _positive("eval.finetune_lr", self.finetune_lr, kind="number")
        if self.finetune_steps < 0:
            raise ConfigError(f"eval.finetune_steps={self.finetune_steps} must be ≥ 0 (0: no fine-tune)")
        names = [n for n in self.scalings if not isinstance(n, str)]
        if names or len(set(self.scalings)) != len(self.scalings):
            raise ConfigError(f"eval.scalings={self.scalings}: list each scaling once by name; "
                              "use e.g. eval.scalings=[none,linear,ntk,dynamic_ntk,yarn]")
        if not self.lengths and (self.stride or self.same_targets or self.scalings or self.finetune_steps):
            raise ConfigError("eval.stride, eval.same_targets, eval.scalings and eval.finetune_steps score the "
                              "eval.lengths windows; set eval.lengths=[...] too")
        if self.finetune_length is not None and not self.finetune_steps:
            raise ConfigError(f"eval.finetune_length={self.finetune_length} is unused with eval.finetune_steps=0; "
                              "set eval.finetune_steps or drop eval.finetune_length")
        if self.finetune_steps and not self.scalings:
            raise ConfigError("eval.finetune_steps fine-tunes under each eval.scalings entry; set eval.scalings "
                              "(e.g. [none,yarn]) or eval.finetune_steps=0")
        if self.lengths and min(self.lengths) < max(self.stride or 0, self.same_targets or 0):
            raise ConfigError(f"eval.stride={self.stride} / eval.same_targets={self.same_targets} must not exceed "
                              f"the shortest eval length {min(self.lengths)}: a window scores at most its length")


@dataclass(frozen=True)
class CheckpointSettings:
    every_n_steps: int | None = 100  # 0 or null: off
    dir: str | None = None

    def __post_init__(self):
        if self.every_n_steps is not None and self.every_n_steps < 0:
            raise ConfigError(f"checkpoint.every_n_steps={self.every_n_steps} must be a whole number of steps "
                              "≥ 0 (0 or null: off)")


@dataclass(frozen=True)
class ReportSettings:
    """``report``; the same declared ranges bound ``python -m results report --target / --min-order-gain``."""

    target_loss: Positive | None = None  # "steps to target" threshold, nats/token
    min_order_gain: NonNegative = 0.05  # val/order_gain below it: "not yet using order" (conf/config.yaml says why)
    baseline: str | None = None  # the pos the report compares every other scheme with (results/verdicts.py)
    alpha: SignificanceLevel = 0.05  # a paper claim's family-wise level, Holm-corrected (results/paper.py)


@dataclass(frozen=True)
class LoggerSettings:
    tracking_uri: str | None = None
    experiment: str = "posbench"

    def __post_init__(self):
        if not self.experiment.strip():
            raise ConfigError("logger.experiment='' must name an MLflow experiment, e.g. logger.experiment=posbench")


@dataclass(frozen=True)
class ProgressSettings:
    """``progress``: how training shows its progress (harness/model/progress.py); nothing at all when
    ``trainer.enable_progress_bar`` is false."""

    mode: Literal["auto", "bar", "lines"] = "auto"  # auto: a live bar when stdout is a terminal, else lines
    every_n_steps: int = 50  # lines: one line every N optimizer steps, and one at each validation

    def __post_init__(self):
        _positive("progress.every_n_steps", self.every_n_steps)


@dataclass(frozen=True)
class OptimSettings:
    optimizer: dict = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)
    tuned: str | None = None  # a best.json of `python -m results tune`: this cell's tuned values (config/tuned.py)


ACCELERATORS = Literal["cpu", "gpu", "cuda", "mps", "tpu", "auto"]
# Lightning 2.6's accepted precision values (lightning.fabric.connector._PRECISION_INPUT)
PRECISIONS = Literal["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true", "transformer-engine",
                     "transformer-engine-float16", "32", "16", "bf16", "64", 32, 16, 64]


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The ``lightning.Trainer`` keys of conf/trainer/*.yaml, with the ranges this harness needs.
    Any other Trainer argument (``+trainer.profiler=simple``) is checked against Lightning's signature.
    The keys conf/trainer/cpu.yaml sets have no default here: Lightning's own differ (``max_steps=-1`` trains
    without end, ``enable_checkpointing=True`` writes checkpoints of its own), so removing one
    (``~trainer.max_steps``) is refused, not handed to Lightning."""

    accelerator: ACCELERATORS
    devices: int | str | list[int]
    max_steps: int
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    log_every_n_steps: int
    gradient_clip_val: int | float | None
    accumulate_grad_batches: int
    precision: PRECISIONS
    num_sanity_val_steps: int
    enable_checkpointing: bool
    enable_model_summary: bool
    enable_progress_bar: bool
    strategy: str = "auto"
    num_nodes: int = 1

    def __post_init__(self):
        for key in ("max_steps", "log_every_n_steps", "accumulate_grad_batches", "num_nodes"):
            _positive(f"trainer.{key}", getattr(self, key))
        if self.max_steps > MAX_STEPS:  # the loaders' example count (steps × batch) must stay an index-sized integer
            raise ConfigError(f"trainer.max_steps={self.max_steps} is more steps than any run takes; use at most "
                              f"{MAX_STEPS:,}")
        _positive("trainer.val_check_interval", self.val_check_interval,
                  kind="integer (steps) or a fraction of an epoch")
        if self.gradient_clip_val is not None and self.gradient_clip_val < 0:
            raise ConfigError(f"trainer.gradient_clip_val={self.gradient_clip_val} must be ≥ 0 (or null: no clipping)")
        if self.num_sanity_val_steps < -1:
            raise ConfigError(f"trainer.num_sanity_val_steps={self.num_sanity_val_steps} must be ≥ 0 (or -1: all)")
        if self.check_val_every_n_epoch is not None:  # Lightning would count val_check_interval within an epoch
            raise ConfigError(f"trainer.check_val_every_n_epoch={self.check_val_every_n_epoch}: posbench validates "
                              "every trainer.val_check_interval optimizer steps over the whole run (its training "
                              "loader is one epoch); leave it null and set trainer.val_check_interval")
        self._check_devices()
        self._check_strategy()

    def _check_strategy(self) -> None:
        """A name Lightning's registry holds; read from Lightning (seconds to import) only for a name not known."""
        if isinstance(self.strategy, str) and self.strategy not in ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"):
            from lightning.pytorch.strategies import StrategyRegistry

            names = StrategyRegistry.available_strategies()
            if self.strategy not in names:
                raise ConfigError(f"trainer.strategy={self.strategy!r} is not a Lightning strategy; use auto, "
                                  f"{', '.join(n for n in names if '_find_unused' not in n)}")

    def _check_devices(self) -> None:
        d = self.devices
        if isinstance(d, int) and (d == 0 or d < -1):
            raise ConfigError(f"trainer.devices={d} must be a positive count, -1 (all) or auto")
        if isinstance(d, list) and not d:
            raise ConfigError("trainer.devices=[] names no device; give a count, -1 (all), a list of ids or auto")
        if isinstance(d, str) and d != "auto" and not d.replace(",", "").strip().isdigit():
            raise ConfigError(f"trainer.devices={d!r} must be a positive count, -1 (all), a list of ids or auto")
        on_cpu = self.accelerator == "cpu"  # Lightning's CPUAccelerator takes a count of processes only
        if on_cpu and (d == -1 or isinstance(d, list) or (isinstance(d, str) and "," in d)):
            raise ConfigError(f"trainer.devices={d} with trainer.accelerator=cpu: CPU processes are counted, not "
                              "listed (-1 and ids are for GPUs); give a positive count, e.g. trainer.devices=2, or "
                              "auto")


def trainer_arguments() -> list[str]:
    """The parameters of ``lightning.Trainer``, read from its source: importing Lightning takes seconds,
    and a user's extra Trainer argument (``+trainer.profiler=simple``) needs only its name checked here
    (Lightning checks its value when the Trainer is built)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("lightning")  # a top-level spec: nothing is imported
    if spec is None or spec.origin is None:
        raise ConfigError("lightning is not installed; pip install posbench (it requires lightning)")
    source = Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
            return [a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs] if a.arg not in SUPPLIED["trainer"]]
    raise RuntimeError(f"no Trainer.__init__ in {source}")  # a Lightning layout this harness does not know


# Ranges of the torch optimizer arguments a user is likely to set (any torch.optim class).
# An optimizer's step computes in the parameters' float32 (largest 3.4e38) and scales lr on the way (Adam's first
# step divides it by 1 − β₁ = 0.1): beyond this, torch stops at the first step with an overflow, after the run began
OPTIMIZER_MAX = 1e30
_FITS = (f"is beyond {OPTIMIZER_MAX:.0e}: the optimizer's step computes in float32 (largest 3.4e38) and would "
         "overflow at the first step; give a smaller value")
OPTIMIZER_RANGES: tuple[tuple[str, str, typing.Callable[[Any], bool]], ...] = (  # (key, rule, holds), in order
    ("lr", "must be positive, e.g. optim.optimizer.lr=1e-3", lambda v: v > 0),
    ("eps", "must be positive", lambda v: v > 0),
    ("weight_decay", "must be ≥ 0", lambda v: v >= 0),
    *((key, _FITS, lambda v: v <= OPTIMIZER_MAX) for key in ("lr", "eps", "weight_decay")),
    ("momentum", "must lie in [0, 1)", lambda v: 0 <= v < 1),
    ("betas", "must be two numbers in [0, 1), e.g. [0.9,0.98]", lambda v: all(0 <= b < 1 for b in v)),
)

# Plain (target-less) nodes by path; "" is the top level, whose group children are nodes of their own.
@dataclass(frozen=True)
class BudgetSettings:
    """conf/config.yaml ``budget``: the epochs a run may make, and what its GPU-hours are counted at."""

    max_epochs: Positive | None = 100.0  # passes over the training split (None: no limit)
    gpu_tflops: Positive = 989.0  # the GPU's dense bf16 peak (an H100 SXM)
    mfu: Fraction = 0.4  # the model FLOPs utilisation assumed (ranges checked on the config path: check_value)


PLAIN: dict[str, type] = {"": RunSettings, "budget": BudgetSettings, "data": DataSettings, "eval": EvalSettings,
                          "checkpoint": CheckpointSettings, "report": ReportSettings, "logger": LoggerSettings,
                          "optim": OptimSettings, "progress": ProgressSettings}
GROUPS = ("pos", "attn", "model", "data", "tokenizer", "task", "optim", "trainer", "logger")
# Parameters of a ``_target_`` the harness passes itself, by node.
SUPPLIED: dict[str, tuple[str, ...]] = {"pos": ("shape",), "pos.scaling": ("base", "rotated"), "attn": ("shape",),
                                        "task": ("tokenizer",), "optim.optimizer": ("params",),
                                        "trainer": ("logger", "callbacks")}


def plain_fields(schema: type) -> dict[str, Any]:
    hints = typing.get_type_hints(schema, include_extras=True)
    return {f.name: hints[f.name] for f in fields(schema)}
