"""One line on stderr for every mistake a user can make on the command line.

Hydra prints its own errors over several lines (a missing option lists one per line, an
unknown key adds the struct dump) followed by a stack-trace hint, and exits 1. ``run_cli``
asks Hydra to re-raise instead (``HYDRA_FULL_ERROR=1``, set only for this call) and prints
user errors as ``error: <problem>; <fix>`` with exit code 2. A real crash keeps its traceback,
and a user who sets ``HYDRA_FULL_ERROR=1`` gets Hydra's full traces, as Hydra documents.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from harness.errors import ConfigError

FULL_ERROR = "HYDRA_FULL_ERROR"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def user_error(exc: BaseException) -> str | None:
    """The one-line message for a user's mistake, or None for a crash that needs its traceback."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(exc, ConfigError):
        return one_line(exc)
    if isinstance(exc, MissingConfigException):  # pos=foo: Hydra lists the options one per line
        return _missing_option(exc)
    if isinstance(exc, OverrideParseException):
        return (f"cannot parse override {exc.override!r}: {one_line(exc).split(' See https')[0]}; "
                "write key=value, quoting values with special characters, e.g. 'eval.lengths=[128,256]'")
    if isinstance(exc, ConfigCompositionException):  # e.g. model.foo=1: an unknown key
        cause = f" ({one_line(exc.__cause__)})" if exc.__cause__ else ""
        return (f"{one_line(exc)}{cause}; check the key's spelling in conf/ "
                "(python run.py --cfg job prints the whole config)")
    if isinstance(exc, OSError) and exc.filename:  # e.g. hydra.run.dir under /proc or a read-only disk
        return (f"cannot write {exc.filename} ({exc.strerror}); choose a writable place "
                "(hydra.run.dir=, hydra.sweep.dir=, checkpoint.dir=, logger.tracking_uri=)")
    return None


def _missing_option(exc) -> str:
    text = str(exc)
    head = one_line(text.split("Available options")[0].split("Config search path")[0])
    options = exc.options if getattr(exc, "options", None) else []
    group = text.split("Available options in '")[1].split("'")[0] if "Available options in '" in text else ""
    if options and group:
        return f"{head}; use one of {group}={', '.join(options)}"
    return f"{head}; see python run.py --help for the config groups and their options"


def run_cli(main: Callable[[], object]) -> int:
    """Call the @hydra.main entry; 0 on success, 2 (after one line) on a user error."""
    user_wants_traces = os.environ.get(FULL_ERROR) == "1"
    os.environ[FULL_ERROR] = "1"  # Hydra re-raises instead of printing its multi-line report
    try:
        main()
    except Exception as e:
        message = None if user_wants_traces else user_error(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    finally:
        if not user_wants_traces:
            os.environ.pop(FULL_ERROR, None)
    return 0
