"""Run a posbench command inside this interpreter, as a user's process would run it: ``run(entry, argv, cwd, env)``
returns ``{"code", "stdout", "stderr", "seconds"}`` like a real process's exit status and streams.

Why: the bad-input table has hundreds of rows; each in its own process paid the imports of the harness,
MLflow and Lightning on top of the refusal itself. Called here they share one interpreter's imports. The
entry functions are the ones ``python run.py`` / ``posbench`` / ``python -m results`` / ``python -m harness.bench``
call, so what a row tests is what a user runs; what only a real process shows (exit status through ``sys.exit``,
a fresh interpreter's imports, file descriptors, signals) is pinned by tests/process/test_bad_input_process.py,
which also reruns a sample of rows as real commands and compares their lines.

Each call restores what a command may change in the process: the working directory, the environment,
``sys.argv``, the root logger's handlers and level (Hydra's job logging configures them), logging's disable
level, Hydra's global state, and harness/signals.py's record of a stop (a test may stop a run here; a later
sweep in this process must not read it as its own). ``POSBENCH_MALLOC=system`` unless a row sets it:
``keep_freed_memory`` would change malloc for every later test in this process (tests/process/test_allocator.py
tests it in child processes; no refusal depends on it). A hang guard (SIGALRM) turns a row that never ends into a
failure.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sys
import time
from collections.abc import Callable


class Hung(BaseException):  # not an Exception: a command's own `except Exception` must not swallow it
    pass


def _entry(entry: str) -> Callable[[list[str]], int]:
    if entry in ("run", "posbench"):  # python run.py ARGS, posbench ARGS: one entry function
        from harness.main import main as posbench

        def run(argv: list[str]) -> int:
            sys.argv = [f"{entry}.py" if entry == "run" else entry, *argv]
            return posbench()

        return run
    if entry == "results":
        from results.__main__ import main

        return main
    if entry == "harness.bench":
        from harness.bench.cli import main

        return main
    raise ValueError(entry)


def run(
    entry: str | Callable[[list[str]], int], argv: list[str], cwd: str, env: dict[str, str], timeout: float = 120
) -> dict:
    """``entry``: run (``python run.py``), posbench (its subcommands), results, harness.bench, or a command's own
    ``main(argv)``."""
    command = _entry(entry) if isinstance(entry, str) else entry
    from harness import signals

    saved_stop = signals._State.stopped, dict(signals.STOPPED_AT)
    saved_cwd, saved_env, saved_argv = os.getcwd(), dict(os.environ), list(sys.argv)
    root = logging.getLogger()
    saved_handlers, saved_level, saved_disable = list(root.handlers), root.level, logging.root.manager.disable
    out, err = io.StringIO(), io.StringIO()

    def hung(*_):
        raise Hung(f"{entry} {argv} ran past {timeout} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    started = time.perf_counter()
    try:
        os.chdir(cwd)
        os.environ.update({"POSBENCH_MALLOC": "system", **env})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = command(list(argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Hung:
                raise
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging.disable(saved_disable)
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        signals._State.stopped = saved_stop[0]
        signals.STOPPED_AT.clear()
        signals.STOPPED_AT.update(saved_stop[1])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "seconds": time.perf_counter() - started}
