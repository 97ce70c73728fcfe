"""``python run.py`` / ``posbench run|check``: check a config, or train it through Hydra's app.

``--check`` is a loop of ``check(load(cell))`` over the command's cells (one, or every cell of a sweep with ``-m``)
in this process: an ok line with what would train, or the refusal, per cell; exit 0 if all pass, 2 otherwise. A
run checks its cell the same way before Hydra's app starts, so a refused run leaves no output folder; a sweep
(``-m`` without ``--check``) runs that loop first (``preflight``): bad input in any cell refuses the whole sweep,
one line per mistake, before its parent run opens or its first cell trains; an incompatible pairing passes (the
sweep records it as a refused cell, as a grid means it to). Only training runs Hydra's app.

Every user's mistake is one line, ``error: <problem>; <fix>``, and exit 2 (harness/config/hydra_errors.py); a real
crash keeps its traceback, and ``HYDRA_FULL_ERROR=1`` shows Hydra's full traces, as Hydra documents. A run for a GPU
is checked for a GPU of a named size, ``--gpu-memory 80GB`` (the default), which this machine need not have.

May import: harness.config, harness.record (a resume's plan), harness.signals, and the ground.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

from harness.config.catalog import CONFIG_DIR_FLAGS, print_catalogue, user_config_dirs
from harness.config.check import Checked, check
from harness.config.estimates import DEFAULT_GPU_MEMORY, Budget, NamedGpu, gib
from harness.config.hydra_errors import user_error
from harness.config.load import cells, check_single, load
from harness.errors import ConfigError, IncompatiblePairing, said_refusal, users_code_failed

CHECK_FLAG, GPU_MEMORY_FLAG, MATRIX_FLAG, LIST_FLAG = "--check", "--gpu-memory", "--matrix", "--list"
MULTIRUN_FLAGS = ("-m", "--multirun")


def run_command(argv: list[str], train_app: Callable[[], object]) -> int:
    """``python run.py ARGS``: --matrix and --list (anywhere), --check and --gpu-memory are this command's; the rest
    are Hydra's (overrides, -m, --config-dir)."""
    listing = [a for a in argv if a.split("=")[0] in (MATRIX_FLAG, LIST_FLAG)]
    if listing:  # the rest (--config-dir DIR, pos._target_=...) is the listing's to check, in any order
        from harness.config.compat import print_matrix

        rest = [a for a in argv if a != listing[0]]
        print_listing = print_matrix if listing[0].startswith(MATRIX_FLAG) else print_catalogue
        return _guarded(lambda: print_listing(listing[0], rest), rest)
    multirun, checking = any(a in MULTIRUN_FLAGS for a in argv), CHECK_FLAG in argv
    try:
        gpu, args = _gpu_memory(argv, checking)
        dirs = user_config_dirs(args)
        valued = {i + 1 for i, a in enumerate(args) if a in CONFIG_DIR_FLAGS}  # --config-dir DIR's DIR
        overrides = [a for i, a in enumerate(args) if i not in valued and not a.startswith("-")]
        flags = [a for a in args if a.startswith("-") and a.split("=")[0] not in (*CONFIG_DIR_FLAGS, *MULTIRUN_FLAGS)]
        if checking and flags != [CHECK_FLAG]:
            raise ConfigError(
                f"{next(f for f in flags if f != CHECK_FLAG)} is not a flag of --check (it takes "
                f"overrides, -m, --config-dir DIR and {GPU_MEMORY_FLAG} SIZE); drop it"
            )
    except ConfigError as e:
        return said_refusal(e)
    if checking:
        return _guarded(lambda: check_command(overrides, dirs, multirun, gpu), overrides)
    refused = _guarded(
        lambda: preflight(overrides, dirs) if multirun else _single_run(args, overrides, dirs, bool(flags)), overrides
    )
    if refused:
        return refused
    if multirun:
        flag = next(a for a in args if a in MULTIRUN_FLAGS)  # Hydra's parser takes -m before the overrides only
        args = [flag, *(a for a in args if a != flag)]
    return run_app(train_app, args)


def _single_run(args: list[str], overrides: list[str], dirs: list[str], hydra_flags: bool) -> int:
    """A run's cell checked before Hydra's app starts (its output folder with it); with Hydra's own flags (``--cfg``,
    ``--info``, ``--config-name`` …), which train nothing or compose another config, only what they take."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in ("--cfg", "-c"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value not in ("job", "hydra", "all"):
                raise ConfigError(f"{flag} {value}: {flag} prints the config; use {flag} job, hydra or all")
    if hydra_flags:
        check_single(overrides)
        return 0
    checked = check(load(overrides, dirs))
    if checked.spec.run.resume_mode != "new":  # a resume= with nothing to resume is refused here too
        from harness.record.resume import plan_resume

        plan_resume(checked.spec.values, checked.uri, checked.spec.run.resume_mode)
    return 0


def _gpu_memory(args: list[str], checking: bool) -> tuple[NamedGpu | None, list[str]]:
    """``--gpu-memory SIZE`` or ``--gpu-memory=SIZE``: (the GPU it names, the other arguments)."""
    at = next((i for i, a in enumerate(args) if a.split("=")[0] == GPU_MEMORY_FLAG), None)
    if at is None:
        return None, args
    flag, eq, value = args[at].partition("=")
    value = value if eq else (args[at + 1] if at + 1 < len(args) else "")
    if not checking:
        raise ConfigError(
            f"{GPU_MEMORY_FLAG} sizes the GPU that --check checks a run for; add --check "
            f"(python run.py --check {GPU_MEMORY_FLAG} {value or '80GB'} ...)"
        )
    if not value or value.startswith("-"):
        raise ConfigError(f"{GPU_MEMORY_FLAG} needs a size; give one, e.g. {GPU_MEMORY_FLAG} 80GB")
    return NamedGpu.parse(value), args[:at] + args[at + (1 if eq else 2) :]


def check_command(overrides: list[str], dirs: list[str], multirun: bool, gpu: NamedGpu | None) -> int:
    """``--check``: each cell checked in this process, for ``gpu`` (None: the default size); no run is opened. 2 if
    any cell was refused."""
    gpu = NamedGpu.parse(DEFAULT_GPU_MEMORY) if gpu is None else gpu
    budgets, refused, seeds = [], 0, 1
    for cell in cells(overrides, dirs) if multirun else [overrides]:
        named = " ".join(cell) if multirun else ""
        try:
            checked = check(load(cell, dirs, multirun), gpu)
        except Exception as e:
            message = user_error(e, cell)
            if message is None or not multirun:
                raise
            refused += 1
            print(f"refused: {named}: {message}", file=sys.stderr)  # the ok lines on stdout are what would train
            continue
        budgets.append(checked.budget)
        seeds = checked.spec.report.max_seeds if checked.spec.report.seeds == "auto" else 1  # each cell's most runs
        print(ok_line(checked, named, gpu))
    if len(budgets) > 1:
        hours = [seeds * b.gpu_hours for b in budgets if b.gpu_hours is not None]
        whole = Budget(  # the sweep's, said as a cell's budget is
            tokens=seeds * sum(b.tokens for b in budgets),
            train_tokens=None,
            flops=seeds * sum(b.flops for b in budgets),
            gpu_hours=sum(hours) if len(hours) == len(budgets) else None,
        )
        runs = f" × up to {seeds} seeds (report.seeds=auto), at most" if seeds > 1 else ""
        print(f"sweep: {len(budgets)} cells{runs}{whole.line()}")
    return 2 if refused else 0


def ok_line(checked: Checked, cell: str, gpu: NamedGpu) -> str:
    spec, c = checked.spec, checked.spec.choices
    times = f" × {spec.trainer.accumulate_grad_batches} accumulated" if spec.trainer.accumulate_grad_batches > 1 else ""
    fits = (
        f" · GPU of {gpu.named} ({gib(gpu.memory)}): {checked.gpu.what} needs about {checked.gpu.summary()}, fits"
        if checked.gpu
        else ""
    )
    return (
        f"ok: {cell + ': ' if cell else ''}pos={c.pos} attn={c.attn} task={c.task} data={c.data} · "
        f"{checked.n_params:,} parameters · {spec.trainer.max_steps} steps of {spec.data.batch_size}×"
        f"{checked.task.sequence_tokens(spec.data.seq_len)} tokens{times}{checked.budget.line()} · store "
        f"{checked.uri}{fits}"
    )


def preflight(overrides: list[str], dirs: list[str]) -> int:
    """Every cell of a sweep checked before any trains: 0 if all may run (an incompatible pairing may: the sweep
    records it), else 2 after one line per distinct mistake (the same mistake in several cells is one line)."""
    every = cells(overrides, dirs)
    by_mistake: dict[str, list[tuple[list[str], str]]] = {}
    for cell in every:
        try:
            check(load(cell, dirs, multirun=True))
        except IncompatiblePairing:
            continue
        except Exception as e:
            message = user_error(e, cell)
            if message is None:
                raise
            by_mistake.setdefault(re.sub(r"^(\S+?)=\S+", r"\1", message), []).append((cell, message))
    for found in by_mistake.values():
        (cell, message), n = found[0], len(found)
        # the cell named by its swept values: its overrides that some other cell does not share
        swept = " ".join(o for o in cell if any(o not in other for other in every)) or " ".join(cell)
        where, every_cell = (f"cell {swept}: ", "") if n == 1 else ("", f", in {n} cells")
        print(f"error: {where}{message} (the sweep trained nothing{every_cell})", file=sys.stderr)
    return 2 if by_mistake else 0


def _guarded(command: Callable[[], int], args: list[str]) -> int:
    """A command outside Hydra's app: a user's mistake is one line and exit 2 (``_said``)."""
    try:
        return command()
    except Exception as e:
        return _said(e, args, traces=os.environ.get("HYDRA_FULL_ERROR") == "1")


def _said(e: Exception, args: list[str], traces: bool) -> int:
    """Called while ``e`` is handled: a user's mistake is its one line, exit 2; the user's own code raising, its frames
    only, exit 1; a crash is raised again (its traceback kept), and so is everything when ``traces``
    (``HYDRA_FULL_ERROR=1``, as Hydra documents)."""
    message = None if traces else user_error(e, args)
    report = None if traces or message else users_code_failed(e)
    if message is None and report is None:
        raise  # ``e``, the exception being handled, with its traceback
    print(f"error: {message}" if message else report, file=sys.stderr)
    return 2 if message else 1


def run_app(app: Callable[[], object], args: list[str]) -> int:
    """Hydra's app with ``args`` (Hydra reads them from ``sys.argv``, set for the call and put back after); 0 on
    success, 2 after one line for a user's mistake, 130/143 after one line for a stop by a signal."""
    from harness.signals import STOPPED_AT, said_stop

    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing its multi-line report
    saved, sys.argv = sys.argv, [sys.argv[0] if sys.argv else "posbench", *args]
    try:
        app()
    except (SystemExit, KeyboardInterrupt) as e:
        at = STOPPED_AT.get("step")
        saved_at = f"its checkpoint holds step {at}" if at else "it goes on from its last checkpoint"
        then = "resume with the same command plus resume=true"
        if at == 0:  # stopped in training before checkpoint.every_n_steps: resume=true would find nothing
            saved_at, then = "no checkpoint was written yet", "run the same command again to train it afresh"
        return said_stop(
            e, f"the run is closed KILLED and {saved_at}; {then} (a sweep: run it again, finished cells are kept)"
        )
    except Exception as e:
        return _said(e, args, user_wants_traces)
    finally:
        sys.argv = saved
        if not user_wants_traces:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    return 0
