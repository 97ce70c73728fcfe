"""Which project files, and which of their functions, a value typed on the command line passes on its way to the
positional scheme's constructor: the measure of how straight the config path is (issue 42's "files a value passes").

    python tools/value_path.py                      # pos.base=31337 on the default run (pos=rope)
    python tools/value_path.py pos=alibi pos.slopes=31337 ...   # another value: the one equal to --value
    python tools/value_path.py --value 31337 …

A function "passes" the value when one of its arguments holds it at the call: the value itself, a string naming it
(an override ``pos.base=31337``), or a container, config node, dataclass or posbench object reaching it (5 levels
deep). The run goes through ``harness.main.main`` as ``python run.py`` would, and stops at the first call of a
``positional/`` class's ``__init__`` that receives it (nothing is trained, no run is opened: validation comes first).
Only the project's own files count (harness/, positional/, attention/, results/); libraries (Hydra, OmegaConf) do not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = ("harness", "positional", "attention", "results")
VALUE = 31337
DEPTH = 5


class Reached(Exception):
    """The scheme's constructor got the value: the path ends here."""


def holds(x, value, depth: int = 0, seen: set | None = None) -> bool:
    """Whether ``x`` is, names or reaches ``value``."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    seen = set() if seen is None else seen
    if id(x) in seen or depth > DEPTH or isinstance(x, bool):
        return False
    seen.add(id(x))
    if isinstance(x, int | float):
        return x == value
    if isinstance(x, str):
        return str(value) in x
    if isinstance(x, DictConfig | ListConfig):
        try:
            x = OmegaConf.to_container(x, resolve=False)
        except Exception:  # an interpolation that does not resolve: no value to see
            return False
    if isinstance(x, dict):
        return any(holds(k, value, depth + 1, seen) or holds(v, value, depth + 1, seen) for k, v in x.items())
    if isinstance(x, list | tuple | set | frozenset):
        return any(holds(v, value, depth + 1, seen) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return any(holds(getattr(x, f.name, None), value, depth + 1, seen) for f in dataclasses.fields(x))
    attributes = getattr(x, "__dict__", None)
    if isinstance(attributes, dict) and type(x).__module__.split(".")[0] in OURS:
        return holds(attributes, value, depth + 1, seen)
    return False


def trace(overrides: list[str], value=VALUE) -> Counter:
    """``file:function`` → calls that received ``value``, in first-call order, up to the scheme's constructor."""
    from harness.main import main

    calls: Counter = Counter()
    inside = [False]

    def on_call(frame, event, _arg):
        path = frame.f_code.co_filename
        if event != "call" or inside[0] or not path.startswith(ROOT):
            return
        relative = os.path.relpath(path, ROOT)
        if relative.split(os.sep)[0] not in OURS:
            return
        inside[0] = True  # holds() calls OmegaConf: not traced
        try:
            code = frame.f_code
            n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
            if any(holds(frame.f_locals.get(name), value) for name in code.co_varnames[:n]):
                calls[f"{relative}:{code.co_name}"] += 1
                if relative.startswith("positional" + os.sep) and code.co_name == "__init__":
                    raise Reached
        finally:
            inside[0] = False

    argv, sys.argv = sys.argv, ["run.py", *overrides]
    sys.setprofile(on_call)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the harness's own line about the stop: not the user's
            main()
    except (Reached, SystemExit):
        pass
    finally:
        sys.setprofile(None)
        sys.argv = argv
    return calls


def by_file(calls: Counter) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for key in calls:
        file, _, function = key.partition(":")
        files.setdefault(file, []).append(function)
    return files


def main(args: list[str]) -> int:
    value = VALUE
    if args[:1] == ["--value"]:
        value, args = float(args[1]) if "." in args[1] else int(args[1]), args[2:]
    overrides = args or [f"pos.base={value}"]
    calls = trace([*overrides, "trainer.max_steps=1"], value)
    files = by_file(calls)
    reached = any(f.startswith("positional" + os.sep) for f in files)
    print(f"{len(files)} files, {len(calls)} functions, {sum(calls.values())} calls"
          f"{'' if reached else ' (the scheme was never reached with the value)'}")
    for file, functions in files.items():
        print(f"  {file}: {', '.join(functions)}")
    return 0 if reached else 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main(sys.argv[1:]))
