"""A fork server for command-line tests: ``python run.py ARGS`` (or ``python -m MODULE ARGS``) in a
fresh forked process per request, each with its own stdout, stderr, environment and exit status.

Why: a new interpreter pays ~3 s importing torch and Hydra before run.py does anything, and the
bad-input table has over a hundred rows. This server imports those once, then forks: the child is
a real process (its own exit code, its own file descriptors, Lightning and MLflow imported — or not —
by the child itself, as in a fresh ``python``), started in milliseconds. Nothing but torch (with its
``_dynamo``), Hydra and OmegaConf is imported before the fork, and no torch op runs, so no intra-op
thread pool exists to break across fork (importing torch starts one idle helper thread, which the
children do not need; every request has a timeout in case one ever hangs). tests/test_bad_input.py
checks a sample of rows against fresh interpreters too.

Protocol: one JSON request per stdin line, ``{"argv": [...], "module": null | "results", "cwd": ...,
"env": {...}, "timeout": s}``; one JSON reply per stdout line, ``{"code", "stdout", "stderr",
"seconds"}``. ``code`` is None when the child was killed at the timeout.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(request: dict, out_path: str, err_path: str) -> None:
    """Runs in the forked process; never returns."""
    code = 1
    try:
        out, err = os.open(out_path, os.O_WRONLY), os.open(err_path, os.O_WRONLY)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(request.get("cwd") or ROOT)
        os.environ.update(request.get("env") or {})
        module = request.get("module")
        sys.argv = [module or str(ROOT / "run.py"), *request["argv"]]
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(request: dict) -> dict:
    with tempfile.NamedTemporaryFile(delete=False) as out, tempfile.NamedTemporaryFile(delete=False) as err:
        paths = out.name, err.name
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        child(request, *paths)
    code = wait(pid, request.get("timeout", 60))
    seconds = time.perf_counter() - started
    texts = [Path(p).read_text(errors="replace") for p in paths]
    for p in paths:
        os.unlink(p)
    return {"code": code, "stdout": texts[0], "stderr": texts[1], "seconds": seconds}


def wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import hydra  # noqa: F401  (imported once, before any fork)
    import omegaconf  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (the validation's meta-device build imports it: ~2 s)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(serve(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
