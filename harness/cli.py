"""run.py's plumbing: what a job does, ``--check`` and ``--matrix``, and one line for every mistake.

Hydra prints its own errors over several lines (a missing option lists one per line, an
unknown key adds the struct dump) followed by a stack-trace hint, and exits 1. ``run_cli``
asks Hydra to re-raise instead (``HYDRA_FULL_ERROR=1``, set only for this call) and prints
user errors as ``error: <problem>; <fix>`` with exit code 2. A real crash keeps its traceback,
and a user who sets ``HYDRA_FULL_ERROR=1`` gets Hydra's full traces, as Hydra documents.

``python run.py --check <overrides>`` runs the validation pass only (harness/config/validate.py) and
prints what would be trained; with ``-m`` it checks every cell of the sweep (one line each) and trains
nothing. Exit 0 if all pass, 2 otherwise. A sweep (``-m`` without ``--check``) runs that same pass first,
quietly (``preflight``): bad input in any cell refuses the whole sweep, one line per cell, before its
parent run opens or its first cell trains. An incompatible pairing passes: the sweep records it as a
refused cell, as a grid means it to.

A run for a GPU (``trainer.accelerator=gpu``, every ``scale=paper`` preset) is checked for a GPU of a named size,
``--gpu-memory 80GB`` (the default; GiB, MB, TB too), which this machine need not have: the ok line gives the
estimate of its largest step (weights, gradients and AdamW state, activations, logits) and that it fits, and a
step that does not fit is refused with the figure (harness/config/resources.py ``gpu_estimate``).

May import: harness.config, harness.train, harness.sweep, harness.scaleout, harness.record (to name the store), and
the ground.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.config.hydra_errors import one_line, user_error
from harness.config.resources import NamedGpu
from harness.errors import (
    ConfigError,
    Diverged,
    IncompatiblePairing,
    StoreDamaged,
    damaged_store_line,
    said_write_failure,
    store_damage,
)

CHECK_FLAG = "--check"
GPU_MEMORY_FLAG = "--gpu-memory"
MATRIX_FLAG = "--matrix"
LIST_FLAG = "--list"
GROUP_KEYS = ("pos", "attn", "task", "data", "experiment", "scale")


MULTIRUN_FLAGS = ("-m", "--multirun")
LAUNCHER_KEYS = ("hydra/launcher=", "hydra.launcher.")
# Hydra settings the preflight replaces: it runs every cell in this process, logs nothing, writes nowhere
PREFLIGHT_DROPS = (*LAUNCHER_KEYS, "hydra/hydra_logging=", "hydra/job_logging=", "hydra.sweep.dir=",
                   "hydra.output_subdir=")


@dataclass
class Mode:
    """What the jobs of one command do: train (default) or only check, and the refusals seen when checking. Made
    per command and handed to its Hydra app (``app_for(mode)``), never kept in the process."""

    check: bool = False
    preflight: bool = False  # checking a sweep before it launches: collect bad cells, print nothing
    gpu: NamedGpu | None = None  # --check: the GPU a GPU run is checked for
    refused: int = 0
    bad_cells: list[tuple[str, str]] = field(default_factory=list)  # (cell, its one-line error)
    cells: list[str] = field(default_factory=list)  # every cell the preflight checked, to name a bad one by its sweep
    budgets: list = field(default_factory=list)  # --check -m: each cell's harness.config.budget.Budget, summed
    # harness.config.deferred.Constructions: the models a sweep's preflight constructed, for its cells to take
    constructions: Any = None


App = Callable[[Mode], Callable[[], object]]  # a mode → the @hydra.main entry whose jobs run in it


def entry(argv: list[str], app_for: App) -> int:
    """``python run.py ...``: --matrix and --list (anywhere in argv) before Hydra parses it; --check and
    --gpu-memory are this command's, the rest Hydra's (``run_cli`` hands Hydra that list)."""
    args = list(argv[1:])
    listing = [i for i, a in enumerate(args) if a.split("=")[0] in (MATRIX_FLAG, LIST_FLAG)]
    if listing:  # the rest (--config-dir DIR, pos._target_=...) is the command's to check, in any order
        return _listing(args[listing[0]], args[:listing[0]] + args[listing[0] + 1:])
    try:
        gpu_memory, args = _take_gpu_memory(args)
    except ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if CHECK_FLAG in args:
        return _check_command([a for a in args if a != CHECK_FLAG], gpu_memory, app_for)
    if any(flag in args for flag in MULTIRUN_FLAGS):
        flag = next(a for a in args if a in MULTIRUN_FLAGS)  # Hydra's parser takes -m before the overrides only
        args = [flag, *(a for a in args if a != flag)]
        refused, constructions = preflight(args, app_for)
        if refused:
            return refused
        return run_cli(app_for(Mode(constructions=constructions)), args)
    return run_cli(app_for(Mode()), args)


def _check_command(args: list[str], gpu_memory: str | None, app_for: App) -> int:
    """``--check``: every cell validated in this process (a launcher's workers, a preset's joblib or a SLURM array,
    would not be in check mode and would train), no parent run opened; 2 if any cell was refused."""
    from harness.config.resources import DEFAULT_GPU_MEMORY

    try:
        mode = Mode(check=True, gpu=NamedGpu.parse(gpu_memory or DEFAULT_GPU_MEMORY))
    except ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    launcher_error = _launcher_error(args)
    if launcher_error:
        print(f"error: {launcher_error}", file=sys.stderr)
        return 2
    args = [*(a for a in args if not a.lstrip("+~").startswith(LAUNCHER_KEYS)), "hydra/launcher=basic",
            "~hydra.callbacks.mlflow_sweep"]
    code = run_cli(app_for(mode), args)
    if len(mode.budgets) > 1:
        print(_sweep_budget(mode.budgets))
    return 2 if code == 0 and mode.refused else code


def _sweep_budget(budgets: list) -> str:
    """`--check -m`'s last line: what the whole sweep costs, the cells summed (each cell's line says its own)."""
    from harness.config.budget import short_count

    tokens, flops = sum(b.tokens for b in budgets), sum(b.flops for b in budgets)
    hours = [b.gpu_hours for b in budgets if b.gpu_hours is not None]
    gpu = f" ≈ {sum(hours):,.1f} GPU-hours" if len(hours) == len(budgets) else ""
    return f"sweep: {len(budgets)} cells · {short_count(tokens)} tokens · {flops:.1e} FLOPs{gpu}"


def _listing(flag: str, rest: list[str]) -> int:
    """``--matrix[=md]`` or ``--list[=md]`` with the rest of the command line (its own to check)."""
    if flag.split("=")[0] == MATRIX_FLAG:
        from harness.config.compat import print_matrix as command
    else:
        from harness.config.catalog import print_catalogue as command
    return _guarded(lambda: command(flag, rest))


def _take_gpu_memory(args: list[str]) -> tuple[str | None, list[str]]:
    """``--gpu-memory SIZE`` or ``--gpu-memory=SIZE``: (its value, the other arguments; Hydra would read it as an
    override)."""
    for i, arg in enumerate(args):
        if arg == GPU_MEMORY_FLAG or arg.startswith(f"{GPU_MEMORY_FLAG}="):
            value = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            rest = args[:i] + args[i + (1 if "=" in arg else 2):]
            if CHECK_FLAG not in rest:
                raise ConfigError(f"{GPU_MEMORY_FLAG} sizes the GPU that --check checks a run for; add --check "
                                  f"(python run.py --check {GPU_MEMORY_FLAG} {value or '80GB'} ...)")
            if not value or value.startswith("-"):
                raise ConfigError(f"{GPU_MEMORY_FLAG} needs a size; give one, e.g. {GPU_MEMORY_FLAG} 80GB")
            return value, rest
    return None, args


def preflight(args: list[str], app_for: App) -> tuple[int, object]:
    """Check every cell of the sweep ``args`` describe before any trains: 0 if all may run (an incompatible
    pairing may: the sweep records it), else 2 after one line per bad cell; and the models it constructed, for
    the cells to take (harness/config/deferred.py). The launcher's own settings are checked here, since the pass
    runs every cell in this process, quietly, in a temporary sweep dir."""
    import contextlib
    import io
    import logging
    import tempfile

    launcher_error = _launcher_error(args)
    if launcher_error:
        print(f"error: {launcher_error}", file=sys.stderr)
        return 2, None
    from harness.config.deferred import Constructions

    mode = Mode(check=True, preflight=True, constructions=Constructions(keeping=True))
    with tempfile.TemporaryDirectory(prefix="posbench-preflight-") as scratch:
        kept = [a for a in args if not a.lstrip("+~").startswith(PREFLIGHT_DROPS)]
        # hydra/launcher=basic: a preset may choose a launcher in its defaults (experiment=ablation: joblib),
        # whose worker processes would not be in check mode and would train every cell
        quiet = [*kept, "~hydra.callbacks.mlflow_sweep", "hydra/launcher=basic", "hydra/hydra_logging=disabled",
                 "hydra/job_logging=disabled", f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null"]
        logging.disable(logging.INFO)  # a plugin's own log lines (optuna's "A new study created")
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the cells' ok lines, a study's summary
                code = run_cli(app_for(mode), quiet)  # a composition error (pos=foo) is one line, as in the run
        finally:
            logging.disable(logging.NOTSET)
    mode.constructions.keeping = False  # from here the cells take them
    return code or _report_bad_cells(mode.bad_cells, mode.cells), mode.constructions


def _report_bad_cells(bad_cells: list[tuple[str, str]], cells: list[str]) -> int:
    """One line per distinct mistake, each naming its fix (the same mistake at other values of a searched
    setting is one line); 2 if there was any."""
    by_mistake: dict[str, list[tuple[str, str]]] = {}
    for cell, message in bad_cells:
        by_mistake.setdefault(re.sub(r"^(\S+?)=\S+", r"\1", message), []).append((cell, message))
    for found in by_mistake.values():
        (cell, message), n = found[0], len(found)
        where = f"cell {_swept_part(cell, cells)}: " if n == 1 else ""
        every = f", in {n} cells" if n > 1 else ""
        print(f"error: {where}{message} (the sweep trained nothing{every})", file=sys.stderr)
    return 2 if by_mistake else 0


def _swept_part(cell: str, every: list[str]) -> str:
    """The overrides of ``cell`` whose values differ across the sweep's cells (``optim.optimizer.lr=-1``)."""
    values: dict[str, set[str]] = {}
    for one in every:
        for override in one.split():
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    swept = [o for o in cell.split() if len(values.get(o.partition("=")[0], ())) > 1]
    return " ".join(swept) or cell


def _launcher_error(argv: list[str]) -> str | None:
    """hydra.launcher.n_jobs: a positive count of parallel jobs (joblib also takes -1, every core)."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra.launcher.n_jobs":
            for one in value.split(","):
                try:
                    n = int(one)
                except ValueError:
                    n = 0
                if n == 0 or n < -1:
                    return (f"hydra.launcher.n_jobs={one} must be a positive number of parallel jobs (or -1 for "
                            "one per core)")
    return None


def _guarded(command: Callable[[], int]) -> int:
    """A command outside Hydra (--matrix, --list): a user's mistake (a class that does not import) is one line."""
    try:
        return command()
    except ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2


def run_job(cfg: DictConfig, mode: Mode) -> float | None:
    """The body of @hydra.main: check (``mode.check``), train a single run, or train one cell of a sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.config.catalog import retarget
    from harness.config.layers import named_by_pattern

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    choices = {g: hydra_cfg.runtime.choices.get(g) for g in GROUP_KEYS}  # ~pos: none; validation refuses it
    try:
        choices = retarget(cfg, choices, list(hydra_cfg.overrides.task))  # pos._target_=mypkg.MyScheme: its name
        choices = named_by_pattern(cfg, choices)  # pos.layers=[rope,rope,rope,none]: rope×3+none
    except ConfigError as e:  # here, not in run_cli: Hydra would log "Error executing job" first
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    _refuse_unrunnable(hydra_cfg, choices, multirun)
    if mode.check:
        return _check(cfg, choices, " ".join(hydra_cfg.overrides.task) if multirun else None, mode)
    from harness.scaleout import rank_zero_print  # lazy from here: training imports take seconds
    from harness.train import format_summary

    if multirun:  # a cell of a sweep: record any failure, never stop the sweep
        from harness.sweep.callback import job_sweep_tags
        from harness.sweep.cell import train_cell

        return train_cell(cfg, choices, job_sweep_tags(), mode.constructions)
    summary = _train_one(cfg, choices)
    rank_zero_print(format_summary(summary))  # DDP: every rank gets here; rank 0 speaks
    return summary.val_loss


def _refuse_unrunnable(hydra_cfg, choices: dict[str, str], multirun: bool) -> None:
    """A preset that is a sweep, run without -m; an empty output folder: one line, exit 2."""
    pinned = {o.lstrip("+").partition("=")[0] for o in hydra_cfg.overrides.task}
    axes = [a for a in hydra_cfg.sweeper.get("params") or {} if a.lstrip("+") not in pinned]  # +a=… pins +a
    if axes and not multirun:  # experiment=grid without -m would train one run of the defaults, untuned
        print(f"error: experiment={choices['experiment']} is a sweep over {', '.join(axes)}: add -m to run its "
              f"cells, or pin {' and '.join(f'{a}=...' for a in axes)} for one run of it", file=sys.stderr)
        sys.exit(2)
    out = hydra_cfg.sweep.dir if multirun else hydra_cfg.run.dir
    if not str(out).strip():  # an empty output dir is the working directory: runs would litter it
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        print(f"error: {key}='' names no directory; give one (e.g. {key}=outputs/mine) or leave it out",
              file=sys.stderr)
        sys.exit(2)


def _train_one(cfg: DictConfig, choices: dict[str, str]):
    """A single run's summary; its user errors, divergence and full disks each one line (exit 2, 1, 1)."""
    from hydra.errors import InstantiationException

    from harness.train import train

    try:
        summary = train(cfg, choices)
    except (ConfigError, InstantiationException) as e:  # here, not in run_cli: Hydra would log "Error executing job"
        message = user_error(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    except Diverged as e:  # the run is closed FAILED (failure=diverged); an outcome, not a crash: no traceback
        print(f"error: {one_line(e)}; the run is closed FAILED", file=sys.stderr)
        sys.exit(1)
    except StoreDamaged as e:  # found when the run closed (harness/record/run.py)
        print(e, file=sys.stderr)
        sys.exit(1)
    except Exception as e:
        damaged = store_damage(e)  # sqlite's own error, mid-run: its result code, under MLflow's exception
        if damaged:
            from harness.record.store import resolve_tracking_uri

            print(damaged_store_line(resolve_tracking_uri(cfg.logger.tracking_uri), damaged), file=sys.stderr)
            sys.exit(1)
        if not said_write_failure(e, "free space (or raise the limit) and run the same command plus resume=true: "
                                     "the run is closed FAILED where the store could still be written"):
            raise
        sys.exit(1)
    return summary


def _check(cfg: DictConfig, choices: dict[str, str], cell: str | None, mode: Mode) -> None:
    from harness.config.validate import validate

    if mode.preflight:
        mode.cells.append(cell)
    try:
        checked = validate(cfg, choices, mode.gpu, mode.constructions)
    except Exception as e:  # a ConfigError, or a constructor's own error on a value (InstantiationException)
        message = user_error(e)
        if message is None:
            raise
        if cell is None:  # here, not in run_cli: Hydra would log "Error executing job" first
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)
        if mode.preflight:
            if not isinstance(e, IncompatiblePairing):  # a pairing the sweep will record as refused is no error
                mode.bad_cells.append((cell, message))
            return None
        mode.refused += 1
        print(f"refused: {cell}: {message}")
        return None
    if mode.preflight:
        return None
    mode.budgets.append(checked.budget)
    d, accumulated = checked.data, checked.trainer.accumulate_grad_batches
    times = f" × {accumulated} accumulated" if accumulated > 1 else ""
    print(f"ok: {cell + ': ' if cell else ''}pos={choices['pos']} attn={choices['attn']} task={choices['task']} "
          f"data={choices['data']} · {checked.n_params:,} parameters · {checked.trainer.max_steps} steps of "
          f"{d.batch_size}×{checked.task.sequence_tokens(d.seq_len)} tokens{times}{checked.budget.line()} · store "
          f"{checked.uri}{_gpu_line(checked, mode.gpu)}")
    return None


def _gpu_line(checked, gpu) -> str:
    """`` · GPU of 80GB (74.5 GiB): a training step needs about 14.2 GiB (…), fits``: a run checked for one."""
    from harness.config.resources import gib

    est = checked.gpu
    if est is None:
        return ""
    return f" · GPU of {gpu.named} ({gib(gpu.memory)}): {est.what} needs about {est.summary()}, fits"


FULL_ERROR = "HYDRA_FULL_ERROR"


def users_code_failed(exc: BaseException) -> str | None:
    """Where the error was raised in the user's own code (a ``pos._target_`` class, a task of theirs): its class
    named and only its frames shown — not Hydra's, Lightning's and posbench's 60 lines around them. None when the
    innermost frame is not the user's (a crash of posbench or a library keeps its whole traceback)."""
    import traceback

    inner = exc
    while (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    frames = traceback.extract_tb(inner.__traceback__)
    if not frames or not _users_file(frames[-1].filename):
        return None
    theirs = [f for f in frames if _users_file(f.filename)]
    shown = "".join(traceback.format_list(theirs)).rstrip()
    tb = inner.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    self = tb.tb_frame.f_locals.get("self") if tb is not None else None  # the user's class, if a method raised
    name = f"{type(self).__module__}.{type(self).__qualname__}.{frames[-1].name}" if self is not None else \
        frames[-1].name
    owner = f"{name}, {frames[-1].filename}"
    return (f"error: your code raised {type(inner).__name__}: {inner} ({owner}, line {frames[-1].lineno}); its "
            f"frames (posbench's and its libraries' left out; HYDRA_FULL_ERROR=1 shows them all):\n{shown}")


def _users_file(filename: str) -> bool:
    """A file that is neither posbench's nor Python's nor an installed library's."""
    import sysconfig

    from harness.paths import ROOT

    path = Path(filename).resolve() if not filename.startswith("<") else None
    if path is None:
        return False
    ours = [ROOT / d for d in ("harness", "positional", "attention", "results", "run.py", "hydra_plugins")]
    libraries = {Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
                 if (p := sysconfig.get_paths().get(key))}
    return not any(path.is_relative_to(d) for d in [*ours, *libraries])


def _stopped_line(code: int) -> str:
    """One line for a run stopped by a signal: what happened to it and how to go on."""
    from harness.signals import STOPPED_AT

    how = "SIGTERM" if code == 143 else "Ctrl-C"
    at = STOPPED_AT.get("step")
    saved = f"its checkpoint holds step {at}" if at else "it goes on from its last checkpoint"
    return (f"stopped by {how}: the run is closed KILLED and {saved}; resume with the same command plus "
            "resume=true (a sweep: run it again, finished cells are kept)")


def run_cli(main: Callable[[], object], args: list[str]) -> int:
    """Call the @hydra.main entry with ``args`` (Hydra reads them from ``sys.argv``, set for the call and put
    back after); 0 on success, 2 (after one line) on a user error."""
    from harness.signals import exit_code

    user_wants_traces = os.environ.get(FULL_ERROR) == "1"
    os.environ[FULL_ERROR] = "1"  # Hydra re-raises instead of printing its multi-line report
    saved = sys.argv
    sys.argv = [saved[0] if saved else "posbench", *args]
    try:
        main()
    except (SystemExit, KeyboardInterrupt) as e:
        code = exit_code(e)
        if code is None:
            raise
        print(f"error: {_stopped_line(code)}", file=sys.stderr)
        return code
    except Exception as e:
        message = None if user_wants_traces else user_error(e)
        if message is None:
            report = None if user_wants_traces else users_code_failed(e)
            if report is None:
                raise
            print(report, file=sys.stderr)
            return 1
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
        if not user_wants_traces:
            os.environ.pop(FULL_ERROR, None)
    return 0
