"""``RunSpec``: a run as typed values, the one thing ``check`` and ``build`` read.

``load`` (harness/config/load.py) makes it from Hydra's composed config; nothing after it sees a DictConfig. Two
kinds of parts:
- **settings**, the frozen dataclasses below (``data``, ``eval``, ``trainer`` …): each field's type and range is its
  annotation (harness/ranges.py), checked by ``check_fields`` in ``__post_init__``, which adds only the rules across
  fields;
- **components**, a config node with ``_target_`` (``pos``, ``task``, ``data.source``, ``optim.optimizer`` …): the
  class it names and its keyword arguments, each checked against the class's signature when loaded
  (harness/config/values.py). ``Component.build`` calls the class; a ``ConfigError`` its constructor raises is
  worded as the config key the user typed (``pos.layers[1].base=0 …``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar

from harness.config.catalog import option_name
from harness.errors import ConfigError
from harness.ranges import (
    FLOAT32_MAX,
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    Range,
    SignificanceLevel,
    check_fields,
)

if TYPE_CHECKING:
    from harness.model.layers import LayerPattern
    from harness.model.transformer import ModelConfig

T = TypeVar("T")
Json = dict[str, object]  # a resolved config node: what a run records as its params and config.yaml

NUMERIC_SEED_MAX = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything feeds
MAX_STEPS = 10**12  # trainer.max_steps: a trillion optimizer steps, beyond any run
MAX_POSITION = 2**40  # pos.max_position: positions are drawn from a permutation of them (8 bytes each), per forward
WORKERS_PER_CORE = 4  # data loader processes: beyond this many per core they add memory, not throughput

Steps = Annotated[
    PositiveInt,
    Range(f"at most {MAX_STEPS:,}", le=MAX_STEPS, said=f"is more steps than any run takes; use at most {MAX_STEPS:,}"),
]
Factor = Annotated[
    float,
    Range(
        "a number > 1 (the lengths the scaling extends to, over the training length), within float32's range",
        gt=1,
        le=FLOAT32_MAX,
    ),
]
ACCELERATORS = Literal["cpu", "gpu", "cuda", "mps", "tpu", "auto"]
# Lightning 2.6's accepted precision values (lightning.fabric.connector._PRECISION_INPUT)
PRECISIONS = Literal[
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "64-true",
    "transformer-engine",
    "transformer-engine-float16",
    "32",
    "16",
    "bf16",
    "64",
    32,
    16,
    64,
]


def max_workers() -> int:
    """The most data loader worker processes a run may ask for on this machine."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class RunSettings:
    """The top-level keys of conf/config.yaml that are not config groups, but ``phases`` (``RunSpec.phases``)."""

    seed: Annotated[int, Range("in [0, 2^32 − 1], e.g. seed=0", ge=0, le=NUMERIC_SEED_MAX, verb="lie")] = 0
    resume: object = None  # null/false: a new run; true; auto; or a checkpoint path (``resume_mode`` types it)
    claim: dict | None = None  # a paper preset's claim: report metadata (results/paper.py)
    paper: dict | None = None  # a scale=paper file's statement of the paper's setting (harness/config/estimates.py)
    scale: dict | None = None  # the scale=toy|paper group: sizes live in conf/experiment/<preset>/scale/
    diagnostics: bool = False  # true: attention diagnostics attached to the run (harness/model/diagnostics.py)
    export: Literal["hf"] | None = None  # hf: the final model in transformers' format (harness/pretrained/export.py)

    def __post_init__(self):
        self.resume_mode  # noqa: B018  refused here, when loaded
        check_fields(self, "")

    @property
    def resume_mode(self) -> str | Path:
        """``resume``: null/false → "new", true → "require", "auto", or a checkpoint path."""
        if self.resume is None or self.resume is False:
            return "new"
        if self.resume is True:
            return "require"
        if self.resume == "auto":
            return "auto"
        if isinstance(self.resume, str) and self.resume.endswith(".ckpt"):
            return Path(self.resume).expanduser().absolute()
        raise ConfigError(
            f"resume={self.resume!r}: use resume=true, resume=auto, resume=false or resume=/path/to/step-K.ckpt"
        )


# Lightning's strategies that start the ranks from inside fit (refused: see TrainerSettings._check_strategy)
SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")


@dataclass(frozen=True)
class DataSettings:
    """``data``: the loader keys every source shares, plus the keys some sources read (the corpus itself is the
    ``data.source`` component)."""

    seq_len: PositiveInt = 128
    batch_size: PositiveInt = 32
    # None: the whole validation split
    eval_batches: Annotated[int, Range("positive, or null for all", ge=1)] | None = None
    # training DataLoader worker processes (examples are pure functions of their index)
    num_workers: Annotated[int, Range("≥ 0 (0: examples made in the training process)", ge=0)] = 0
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

    def __post_init__(self):
        check_fields(self, "data")
        if self.num_workers > max_workers():
            raise ConfigError(
                f"data.num_workers={self.num_workers} exceeds {max_workers()} ({WORKERS_PER_CORE} per "
                f"core of this machine's {os.cpu_count() or 1}): each worker is a process with its own "
                f"copy of the dataset, and more only fork memory; use at most {max_workers()}"
            )


SOURCE_KEYS = (
    "path",
    "download",
    "name",
    "config",
    "split",
    "val_split",
    "val_by",
    "text_column",
    "streaming",
    "max_bytes",
    "windows",
)  # DataSettings keys only some sources read (the others are refused)


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: what the final model is scored on beyond the validation split (docs/length-extrapolation.md).
    The keys beyond ``lengths`` are checked against the task and the scheme in harness/config/pairings.py."""

    lengths: list[PositiveInt] = field(default_factory=list)  # score at each length -> val/loss_at_<L>
    stride: PositiveInt | None = None  # sliding windows advancing S tokens -> val/loss_at_<L>_stride_<S>
    same_targets: PositiveInt | None = None  # K: the same last K tokens at every length -> val/loss_at_<L>_last_<K>
    position_buckets: PositiveInt = 8  # loss_by_position.csv/.png: buckets per window
    scalings: list[str] = field(default_factory=list)  # RoPE scalings the trained model is scored under
    finetune_steps: NonNegativeInt = 0  # > 0: fine-tune under each scaling, then score -> val/finetuned/<s>/...
    finetune_length: PositiveInt | None = None  # null: the longest eval length
    finetune_lr: Positive = 1.0e-4

    @property
    def tune_length(self) -> int | None:
        """The length the fine-tune trains at (eval.finetune_length, else the longest eval length); None: none."""
        return (self.finetune_length or max(self.lengths)) if self.finetune_steps and self.lengths else None

    def __post_init__(self):
        check_fields(self, "eval")
        if len(set(self.scalings)) != len(self.scalings):
            raise ConfigError(
                f"eval.scalings={self.scalings}: list each scaling once by name; "
                "use e.g. eval.scalings=[none,linear,ntk,dynamic_ntk,yarn]"
            )
        if not self.lengths and (self.stride or self.same_targets or self.scalings or self.finetune_steps):
            raise ConfigError(
                "eval.stride, eval.same_targets, eval.scalings and eval.finetune_steps score the "
                "eval.lengths windows; set eval.lengths=[...] too"
            )
        if self.finetune_length is not None and not self.finetune_steps:
            raise ConfigError(
                f"eval.finetune_length={self.finetune_length} is unused with eval.finetune_steps=0; "
                "set eval.finetune_steps or drop eval.finetune_length"
            )
        if self.finetune_steps and not self.scalings:
            raise ConfigError(
                "eval.finetune_steps fine-tunes under each eval.scalings entry; set eval.scalings "
                "(e.g. [none,yarn]) or eval.finetune_steps=0"
            )
        if self.lengths and min(self.lengths) < max(self.stride or 0, self.same_targets or 0):
            raise ConfigError(
                f"eval.stride={self.stride} / eval.same_targets={self.same_targets} must not exceed "
                f"the shortest eval length {min(self.lengths)}: a window scores at most its length"
            )


@dataclass(frozen=True)
class CheckpointSettings:
    every_n_steps: Annotated[int, Range("a whole number of steps ≥ 0 (0 or null: off)", ge=0)] | None = 100
    dir: str | None = None

    def __post_init__(self):
        check_fields(self, "checkpoint")


@dataclass(frozen=True)
class ReportSettings:
    """``report``; the same declared ranges bound ``python -m results report --target / --min-order-gain``."""

    target_loss: Positive | None = None  # "steps to target" threshold, nats/token
    min_order_gain: NonNegative = 0.05  # val/order_gain below it: "not yet using order" (conf/config.yaml says why)
    baseline: str | None = None  # the pos the report compares every other scheme with (results/verdicts.py)
    alpha: SignificanceLevel = 0.05  # a paper claim's family-wise level, Holm-corrected (results/paper.py)
    margin: Positive | None = None  # equivalence margin of a sweep's verdicts, nats/token (results/verdicts.py)
    seeds: Literal["fixed", "auto"] = "fixed"  # auto: seeds added in stages until each comparison is decided
    stage: Annotated[int, Range("at least 2 (a t test needs two seeds a side)", ge=2, le=1000)] = 3
    max_seeds: Annotated[int, Range("at least 2", ge=2, le=1000)] = 10  # seeds per arm at the last look
    spending: Literal["obrien-fleming", "pocock"] = "obrien-fleming"  # the α-spending of the looks' boundaries

    def __post_init__(self):
        check_fields(self, "report")
        if self.max_seeds < self.stage:
            raise ConfigError(
                f"report.max_seeds={self.max_seeds} is below report.stage={self.stage}, the first look's seeds; "
                f"raise report.max_seeds or lower report.stage"
            )


@dataclass(frozen=True)
class LoggerSettings:
    tracking_uri: str | None = None
    experiment: str = "posbench"

    def __post_init__(self):
        check_fields(self, "logger")
        if not self.experiment.strip():
            raise ConfigError("logger.experiment='' must name an MLflow experiment, e.g. logger.experiment=posbench")


@dataclass(frozen=True)
class ProgressSettings:
    """``progress``: how training shows its progress (harness/model/progress.py); nothing at all when
    ``trainer.enable_progress_bar`` is false."""

    mode: Literal["auto", "bar", "lines"] = "auto"  # auto: a live bar when stdout is a terminal, else lines
    every_n_steps: PositiveInt = 50  # lines: one line every N optimizer steps, and one at each validation

    def __post_init__(self):
        check_fields(self, "progress")


@dataclass(frozen=True)
class BudgetSettings:
    """``budget``: the epochs a run may make, and what its GPU-hours are counted at (harness/config/estimates.py)."""

    max_epochs: Positive | None = 100.0  # passes over the training split (None: no limit)
    gpu_tflops: Positive = 989.0  # the GPU's dense bf16 peak (an H100 SXM)
    mfu: Annotated[float, Range("a number in (0, 1]", gt=0, le=1)] = 0.4  # the model FLOPs utilisation assumed

    def __post_init__(self):
        check_fields(self, "budget")


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """The ``lightning.Trainer`` keys of conf/trainer/*.yaml, with the ranges this harness needs; ``extra`` holds
    any other Trainer argument (``+trainer.profiler=simple``), its name checked against Lightning's signature. The
    keys conf/trainer/cpu.yaml sets have no default here: Lightning's own differ (``max_steps=-1`` trains without
    end, ``enable_checkpointing=True`` writes checkpoints of its own), so removing one is refused."""

    accelerator: ACCELERATORS
    devices: int | str | list[int]
    max_steps: Steps
    val_check_interval: Annotated[float, Range("a positive integer (steps) or a fraction of an epoch", gt=0)]
    check_val_every_n_epoch: int | None
    log_every_n_steps: PositiveInt
    gradient_clip_val: Annotated[float, Range("≥ 0 (or null: no clipping)", ge=0)] | None
    accumulate_grad_batches: PositiveInt
    precision: PRECISIONS
    num_sanity_val_steps: Annotated[int, Range("≥ 0 (or -1: all)", ge=-1)]
    enable_checkpointing: bool
    enable_model_summary: bool
    enable_progress_bar: bool
    strategy: str = "auto"
    num_nodes: PositiveInt = 1
    extra: Mapping[str, Any] = field(default_factory=dict)  # Lightning's to judge: its names are checked on load

    def __post_init__(self):
        check_fields(self, "trainer")
        if isinstance(self.val_check_interval, float) and self.val_check_interval > 1:
            raise ConfigError(
                f"trainer.val_check_interval={self.val_check_interval} must be a whole number of "
                "optimizer steps or a fraction ≤ 1 of an epoch; e.g. trainer.val_check_interval=100"
            )
        if self.check_val_every_n_epoch is not None:  # Lightning would count val_check_interval within an epoch
            raise ConfigError(
                f"trainer.check_val_every_n_epoch={self.check_val_every_n_epoch}: posbench validates "
                "every trainer.val_check_interval optimizer steps over the whole run (its training "
                "loader is one epoch); leave it null and set trainer.val_check_interval"
            )
        d = self.devices
        if isinstance(d, int) and (d == 0 or d < -1):
            raise ConfigError(f"trainer.devices={d} must be a positive count, -1 (all) or auto")
        if isinstance(d, list) and not d:
            raise ConfigError("trainer.devices=[] names no device; give a count, -1 (all), a list of ids or auto")
        if isinstance(d, str) and d != "auto" and not d.replace(",", "").strip().isdigit():
            raise ConfigError(f"trainer.devices={d!r} must be a positive count, -1 (all), a list of ids or auto")
        # Lightning's CPUAccelerator takes a count of processes only
        if self.accelerator == "cpu" and (d == -1 or isinstance(d, list) or (isinstance(d, str) and "," in d)):
            raise ConfigError(
                f"trainer.devices={d} with trainer.accelerator=cpu: CPU processes are counted, not "
                "listed (-1 and ids are for GPUs); give a positive count, e.g. trainer.devices=2, or "
                "auto"
            )
        self._check_strategy()

    def _check_strategy(self) -> None:
        """A name Lightning's registry holds; read from Lightning (seconds to import) only for a name not known."""
        if self.strategy.startswith(SPAWNING):
            raise ConfigError(
                f"trainer.strategy={self.strategy}: its ranks train a copy of the run in processes started from "
                "inside fit, which hand back none of what the run records (its validation results, its MLflow "
                "run); use trainer.strategy=ddp (trainer=ddp), which starts every rank as this command"
            )
        if self.strategy not in ("auto", "ddp", "fsdp", "deepspeed"):
            from lightning.pytorch.strategies import StrategyRegistry

            names = StrategyRegistry.available_strategies()
            if self.strategy not in names:
                raise ConfigError(
                    f"trainer.strategy={self.strategy!r} is not a Lightning strategy; use auto, "
                    f"{', '.join(n for n in names if '_find_unused' not in n and not n.startswith(SPAWNING))}"
                )

    @property
    def on_gpu(self) -> bool:
        return self.accelerator in ("gpu", "cuda")

    def processes(self) -> int | None:
        """Processes this node starts (a count, "N", a list of ids or "0,1"); None: auto or -1."""
        d = self.devices
        if isinstance(d, list):
            return len(d)
        if isinstance(d, str):
            ids = [x for x in d.split(",") if x.strip()]
            return len(ids) if "," in d else (int(d) if d.strip().isdigit() else None)
        return d if d > 0 else None


# ---------------------------------------------------------------- components


@dataclass(frozen=True)
class Component(Generic[T]):
    """A config node with ``_target_``: the callable it names and its keyword arguments, each checked against the
    callable's signature (a nested node with ``_target_`` is a component of its own, handed in as its factory)."""

    key: str  # where the user typed it: "pos", "data.source", "phases[0].pos", "pos.layers[2]"
    target: Callable[..., T]
    kwargs: Mapping[str, object]

    def factory(self) -> Callable[..., T]:
        """The callable with this node's arguments bound; the caller passes the ones the harness supplies (a
        scheme's ``shape``, a task's ``tokenizer``). A constructor's one-line error names the key as typed."""
        bound = {k: v.factory() if isinstance(v, Component) else v for k, v in self.kwargs.items()}
        names = [*self.kwargs, *(k for v in self.kwargs.values() if isinstance(v, Component) for k in v.kwargs)]
        return keyed(self.target, self.key, names, bound)

    def build(self, *args: object, **supplied: object) -> T:
        return self.factory()(*args, **supplied)

    @property
    def name(self) -> str:
        """The option name a class goes by (``config_name()``, else its module's last part)."""
        return option_name(self.target)


def keyed(make: Callable[..., T], node: str, names: list[str], bound: Mapping[str, object]) -> Callable[..., T]:
    """``make`` with ``bound`` passed, a library error it raises (``base=0 must be positive``) worded as the config
    key (``pos.base=0 …``): every ``name=`` of a constructor argument not already part of a dotted key gets the
    node's prefix, and so does a field of one (``scaling.factor=`` -> ``pos.scaling.factor=``)."""

    def call(*args: object, **supplied: object) -> T:
        try:
            return make(*args, **bound, **supplied)
        except ConfigError as e:
            message = str(e)
            for name in sorted(set(names), key=len, reverse=True):
                message = re.sub(rf"(?<![\w.\]]){re.escape(name)}(?==|\.\w+=)", f"{node}.{name}", message)
            raise type(e)(message) from None

    return call


@dataclass(frozen=True)
class Randomize:
    """``pos.randomize``, ``pos.max_position``, ``pos.eval_positions``: the wrapper any scheme takes
    (positional/randomized.py)."""

    randomize: bool = False
    max_position: Annotated[PositiveInt, Range(f"at most {MAX_POSITION:,}", le=MAX_POSITION)] | None = None
    eval_positions: Literal["sampled", "ordered"] | None = None

    def __post_init__(self):
        check_fields(self, "pos")


@dataclass(frozen=True)
class Choice(Generic[T]):
    """The run's ``pos`` or ``attn``: one option, or a per-layer pattern of options (``pos.layers``; each distinct
    entry a component, harness/model/layers.py)."""

    name: str  # the cell's name for it: "rope", or the pattern's "rope×3+none"
    option: Component[T]  # the chosen option's node (a pattern's layers named like it are built from it)
    pattern: tuple[str, ...] = ()  # the repeating unit of entries, () without a pattern
    entries: Mapping[str, Component[T]] = field(default_factory=dict)  # each distinct entry of the pattern
    randomize: Randomize = Randomize()  # pos only

    def factory(self) -> Callable[..., T] | LayerPattern:
        """What the model is built from: one constructor ``Shape -> module``, or a ``LayerPattern``."""
        if self.pattern:
            from harness.model.layers import LayerPattern

            return LayerPattern(
                f"{self.option.key}.layers", self.pattern, {e: self._wrapped(c) for e, c in self.entries.items()}
            )
        return self._wrapped(self.option)

    def _wrapped(self, component: Component[T]) -> Callable[..., T]:
        if not self.randomize.randomize:
            return component.factory()
        from positional.randomized import KEYS, randomized

        wrapped = randomized(
            component.factory(),  # type: ignore[arg-type]  # T is PositionalScheme
            **asdict(self.randomize),  # set on pos only (values.choice)
            cls=component.target,
        )
        return keyed(wrapped, component.key, list(KEYS), {})  # the wrapper's keys are the pos node's: pos.randomize=…


@dataclass(frozen=True)
class PhaseSpec:
    """One entry of ``phases`` (harness/model/phases.py says what a phase does), typed where it was written
    (``key``: ``phases[0]``); its ranges against the run are pairing rules (harness/config/pairings.py)."""

    key: str
    at: int
    pos: Component | None = None  # the scheme from this step on (an option, or one with settings of its own)
    pos_entry: str | None = None  # as written: "none", "rope(base=500000)"
    scaling: str | None = None
    factor: Factor | None = None
    seq_len: int | None = None

    def __post_init__(self):
        check_fields(self, self.key)

    @property
    def label(self) -> str:
        said = (("pos", self.pos_entry), ("scaling", self.scaling), ("factor", self.factor), ("seq_len", self.seq_len))
        return " ".join(f"{k}={v}" for k, v in said if v is not None)


@dataclass(frozen=True)
class Choices:
    """The options the run was composed from: its cell's coordinates in names, tags and reports."""

    pos: str
    attn: str
    task: str
    data: str


@dataclass(frozen=True)
class RunSpec:
    """A run, typed: made by ``load``, read by ``check`` and ``build``."""

    choices: Choices
    run: RunSettings
    data: DataSettings
    source: Component
    eval: EvalSettings
    report: ReportSettings
    logger: LoggerSettings
    progress: ProgressSettings
    budget: BudgetSettings
    checkpoint: CheckpointSettings
    trainer: TrainerSettings
    model: ModelConfig
    tokenizer: Component
    task: Component
    pos: Choice
    attn: Choice
    optimizer: Component  # a partial: build(params)
    schedule: Component
    phases: tuple[PhaseSpec, ...]
    values: Json  # the resolved config: the run's params, config.yaml and config hash

    @property
    def seed(self) -> int:
        return self.run.seed
