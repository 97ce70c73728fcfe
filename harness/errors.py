"""User-facing errors: each message is one line that names the problem and the fix."""

import argparse
import errno
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path


class ConfigError(ValueError):
    """Bad configuration or input, detected before (or instead of) training."""


class IncompatiblePairing(ConfigError):
    """A cell whose options cannot run together: a scheme × attention pairing the variant's declarations refuse,
    or an attention window wider than the sequences it would attend over. A sweep records it and goes on."""


class WorkerConfigError(ConfigError):
    """A ``ConfigError`` raised while a DataLoader worker process made an example (a damaged shard block, say).
    torch re-raises it in the run's process, built from the worker's formatted traceback; the one line travels
    between our own marks through that text, and is all this keeps (``harness/data/loaders.py`` raises it)."""

    MARK = "\x1e"

    def __init__(self, text: object = ""):
        parts = str(text).split(self.MARK)
        # in the worker: the line, marked so the traceback carries it; in the run's process: the marked line back
        super().__init__(parts[-2] if len(parts) >= 3 else f"{self.MARK}{text}{self.MARK}")


class Diverged(FloatingPointError):
    """The training loss became NaN or infinite: the run is FAILED (``failure=diverged``), and one line says
    at which step and what to change."""


class MachineFault(SystemExit):
    """A sweep stopped by its machine (a write failed for want of space, harness/sweep/cell.py): exit 1, its one
    line already printed; ``seen`` says why, for the sweep's parent run (harness/sweep/callback.py closes it)."""

    seen: str | None = None


class StoreDamaged(RuntimeError):
    """The tracking store was damaged while a run wrote to it (truncated or overwritten by something else, found
    when the run closed: sqlite wrote on without noticing); ``str`` is its one line (``damaged_store_line``)."""


# Why a write failed, when the machine and not the code is the cause
_WRITE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EFBIG: "a file-size limit (ulimit -f) was hit",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "an I/O error",
}
# sqlite's result codes for a write the machine refused (the names Python's sqlite3 errors carry, extended codes
# such as SQLITE_IOERR_WRITE included), in sqlite's own words
_SQLITE_WRITES = {
    "SQLITE_IOERR": "disk I/O error",
    "SQLITE_FULL": "database or disk is full",
    "SQLITE_READONLY": "attempt to write a readonly database",
}


def write_failure(exc: BaseException) -> str | None:
    """Why writing failed, if ``exc`` (or an exception it came from) is a full disk, a size limit, a read-only
    or failing device — sqlite reports these as "disk I/O error" — else None."""
    for link in exception_chain(exc):
        if isinstance(link, OSError) and link.errno in _WRITE_ERRNOS:
            return f"{_WRITE_ERRNOS[link.errno]}{f' writing {link.filename}' if link.filename else ''}"
        code = getattr(link, "sqlite_errorname", None) or ""  # sqlite3.Error's, under MLflow's and SQLAlchemy's
        hit = next((words for name, words in _SQLITE_WRITES.items() if code.startswith(name)), None)
        if hit:
            return f"the tracking store could not be written ({hit}: a full disk or a file-size limit)"
    return None


_SQLITE_DAMAGE = ("SQLITE_CORRUPT", "SQLITE_NOTADB")  # sqlite's result codes for a file that is no longer whole


def store_damage(exc: BaseException) -> str | None:
    """sqlite's words, if ``exc`` (or an exception it came from) says the store's file was damaged under the run
    (truncated or overwritten by something else: SQLITE_CORRUPT, SQLITE_NOTADB), else None."""
    for link in exception_chain(exc):
        if (getattr(link, "sqlite_errorname", None) or "").startswith(_SQLITE_DAMAGE):
            return one_line(link)
    return None


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exception each one came from (its cause, else its context), each once."""
    link: BaseException | None = exc
    seen = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def damaged_store_line(store: str, why: str) -> str:
    """The one line for a store damaged while a run wrote to it (mid-run, or found when the run closed)."""
    return (
        f"error: the tracking store {store} was damaged while the run wrote to it ({why}); its records may be "
        "lost: move it aside (or restore a copy) and run the same command again with a new logger.tracking_uri"
    )


def one_line(text: object) -> str:
    """``text`` on one line: each run of whitespace, newlines included, as one space."""
    return " ".join(str(text).split())


def said_refusal(problem: object) -> int:
    """A command's refusal (a ``ConfigError``, mostly, or the command's own words): its one line,
    ``error: <problem>; <fix>``, on stderr, and the exit status every command gives it, 2."""
    print(f"error: {one_line(problem)}", file=sys.stderr)
    return 2


def said_write_failure(exc: BaseException, then: str) -> bool:
    """For a write that failed for want of space (``write_failure``): print the one line every command gives,
    ``error: writing failed: <why>; <then>``, and return True; any other error: print nothing, return False."""
    why = write_failure(exc)
    if why is not None:
        # one write with its newline, flushed: a launcher's worker (joblib) shares stderr with the sweep, whose
        # log lines would otherwise land between the text and print's separate newline
        sys.stderr.write(f"error: writing failed: {why}; {then}\n")
        sys.stderr.flush()
    return why is not None


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are the project's one line (a ConfigError: the command prints ``error: …`` and
    exits 2), not argparse's usage block: the parser of every command-line tool (prepare, results, hf-eval, the
    benchmarks)."""

    def error(self, message: str):
        raise ConfigError(f"{message}; see {self.prog} --help")


def users_code_failed(exc: BaseException) -> str | None:
    """Where the error was raised in the user's own code (a ``pos._target_`` class, a task of theirs): its class
    named and only its frames shown. None when the innermost frame is not the user's (a crash of posbench or a
    library keeps its whole traceback)."""
    *_, inner = exception_chain(exc)  # the innermost exception: where the error began
    frames = traceback.extract_tb(inner.__traceback__)
    if not frames or not _users_file(frames[-1].filename):
        return None
    shown = "".join(traceback.format_list([f for f in frames if _users_file(f.filename)])).rstrip()
    *_, (frame, _) = traceback.walk_tb(inner.__traceback__)  # where it was raised: the user's own frame
    self = frame.f_locals.get("self")  # the user's class, if a method raised
    name = (
        f"{type(self).__module__}.{type(self).__qualname__}.{frames[-1].name}" if self is not None else frames[-1].name
    )
    return (
        f"error: your code raised {type(inner).__name__}: {inner} ({name}, {frames[-1].filename}, line "
        f"{frames[-1].lineno}); its frames (posbench's and its libraries' left out; HYDRA_FULL_ERROR=1 shows "
        f"them all):\n{shown}"
    )


def _users_file(filename: str) -> bool:
    """A file that is neither posbench's nor Python's nor an installed library's."""
    import sysconfig

    from harness.paths import ROOT

    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    ours = [ROOT / d for d in ("harness", "positional", "attention", "results", "run.py", "hydra_plugins")]
    libraries = {
        Path(p).resolve()
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
    return not any(path.is_relative_to(d) for d in [*ours, *libraries])
