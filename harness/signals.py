"""SIGTERM and Ctrl-C tell the truth: a stopped run exits non-zero (143 for SIGTERM, 130 for Ctrl-C), its MLflow
run is closed KILLED with a checkpoint to resume from, and one line says how to resume.

Inside ``trainer.fit`` / ``trainer.validate`` Lightning owns SIGTERM: it lets the current step finish (an
exception raised mid-step could leave an optimizer half-updated) and raises its ``SIGTERMException`` — a
``SystemExit`` with no code, which would exit 0 and make a preempted SLURM job look like success.
``CommittedCheckpoints.on_exception`` saves a checkpoint at that step. Outside them (building, the final
evaluation, the report) ``terminating()`` turns SIGTERM into ``Stopped(143)`` at once. Either way
``exit_code`` names the status the process must exit with. ``held()`` keeps a stop out of the few lines that write
a run's record (created and not yet known, or half-closed), raising it when they end.

Ground: imports nothing from the project.
"""

from __future__ import annotations

import _thread
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STOPPED_AT: dict[str, int] = {}  # "step": the step a stopped run's checkpoint holds (record/callbacks.py)
SWEEP_PID = "POSBENCH_SWEEP_PID"  # the sweep's process, in the environment its local workers (joblib) inherit


class Stopped(SystemExit):
    """The process was told to stop (SIGTERM outside Lightning's loops): exit 128 + the signal number."""

    code: int


class _State:
    in_lightning = False  # Lightning's loop owns SIGTERM meanwhile and stops at the end of the step
    stopped: int | None = None  # the exit status of a stop seen by ``exit_code`` (a sweep's parent reads it)
    orphaned = False  # the sweep's process that launched this worker is gone (``stop_when_orphaned``)


def stopped() -> int | None:
    """143 or 130 once this process has been stopped by SIGTERM or Ctrl-C, else None."""
    return _State.stopped


@contextmanager
def terminating() -> Iterator[None]:
    """SIGTERM raises ``Stopped(143)`` where the code is not inside a Lightning loop, which handles it itself
    (its handler calls this one too: then it does nothing). A stop (SIGTERM or Ctrl-C) raised while a finalizer
    runs — the database driver's weakref callbacks, mid-write — is dropped by Python after printing it; it is
    raised again a moment later instead. The previous handlers are restored after."""

    def handler(signum, frame):
        # Lightning owns SIGTERM only while its own handler is installed (it calls this one too): in fit's set-up
        # (DDP: while the other ranks start) and after its teardown, this is the handler, and nothing else would stop
        if not _State.in_lightning or signal.getsignal(signal.SIGTERM) is handler:
            raise Stopped(128 + signum)

    def dropped(unraisable) -> None:  # a stop raised inside a finalizer, which Python prints and drops: sent again
        if isinstance(unraisable.exc_value, (Stopped, KeyboardInterrupt)):
            kind = signal.SIGTERM if isinstance(unraisable.exc_value, Stopped) else signal.SIGINT
            _thread.start_new_thread(_interrupt_soon, (kind,))  # not from here: it would be dropped again
        else:
            previous_hook(unraisable)

    previous, previous_hook = signal.signal(signal.SIGTERM, handler), sys.unraisablehook
    sys.unraisablehook = dropped
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def _interrupt_soon(kind: signal.Signals) -> None:
    """From another thread: the main thread's handler for ``kind`` runs once it is back in ordinary code."""
    time.sleep(0.05)
    _thread.interrupt_main(kind)


@contextmanager
def held() -> Iterator[None]:
    """SIGTERM and Ctrl-C wait until the block ends, then act as they would have: an exception raised between
    a run written to the store and its id kept would leave it RUNNING with nothing to close it, and one raised
    inside a garbage collector's callback (the database driver's, mid-write) is printed and dropped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {
        kind: signal.signal(kind, lambda signum, frame: arrived.append(signum))
        for kind in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for kind, handler in previous.items():
            signal.signal(kind, handler)
        for signum in dict.fromkeys(arrived):  # each kind once, in the order it came
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


@contextmanager
def lightning_owns_sigterm() -> Iterator[None]:
    """Around ``trainer.fit`` / ``trainer.validate``: a SIGTERM lets the step finish (Lightning's handler)."""
    _State.in_lightning = True
    try:
        yield
    finally:
        _State.in_lightning = False


def exit_code(exc: BaseException) -> int | None:
    """The exit status a stop means: 143 for SIGTERM (Lightning's SIGTERMException, or ``Stopped``), 130 for
    Ctrl-C (Lightning exits 1 after a KeyboardInterrupt), None for anything else."""
    code = None
    if isinstance(exc, Stopped):
        code = exc.code
    elif type(exc).__name__ == "SIGTERMException":
        code = 128 + signal.SIGTERM
    elif isinstance(exc, KeyboardInterrupt) or (
        isinstance(exc, SystemExit) and isinstance(exc.__context__, KeyboardInterrupt)
    ):
        code = 128 + signal.SIGINT
    if code is not None:
        _State.stopped = code
    return code


def said_stop(exc: BaseException, then: str) -> int:
    """Called while ``exc`` is handled: a stop (``exit_code``) is one line on stderr, ``error: stopped by
    SIGTERM|Ctrl-C: <then>`` (run.py's and hf-eval's), and its exit status; anything else is raised again."""
    code = exit_code(exc)
    if code is None:
        raise  # ``exc``, the exception being handled, with its traceback
    print(f"error: stopped by {'SIGTERM' if code == 143 else 'Ctrl-C'}: {then}", file=sys.stderr)
    return code


@functools.cache  # once per process: a launcher's worker trains cell after cell
def stop_when_orphaned(poll_s: float = 1.0) -> None:
    """In a local worker the sweep's process launched (joblib): SIGTERM to this process once that process is gone.
    Killed outright (SIGKILL, the OOM killer), the sweep could not stop its workers, which would train on with no
    parent; told SIGTERM, the cell stops as a stopped run does (closed KILLED, with its checkpoint). The sweep's own
    process (basic launcher) and a worker on another host (submitit) have another parent and are not watched."""
    sweep = os.environ.get(SWEEP_PID, "")
    if sweep != str(os.getppid()):
        return

    def watch() -> None:
        while str(os.getppid()) == sweep:
            time.sleep(poll_s)
        _State.orphaned = True
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-watchdog", daemon=True).start()


def exit_if_orphaned() -> None:
    """After a cell has closed its run: a worker whose sweep is gone exits (143) instead of idling until its
    launcher's timeout, holding its memory (a GPU's too)."""
    if _State.orphaned:
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
