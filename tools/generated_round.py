"""Hostile inputs generated from what the entry points declare, not listed by hand: every key of every config
option (composed as ``posbench check`` composes it) and every flag of every command's parser, each given values a
hostile user types (a word, a negative, zero, a huge or non-finite number, null, a list where a scalar is, paths
that are a file, missing, under /proc). Each try calls the command's entry function in one interpreter
(tests/inprocess.py, as the bad-input table does), in a fresh folder with a fresh store, and is classified:

  one line    exit 2 (or 1), one stderr line starting "error: ", no traceback
  accepted    exit 0
  traceback   a Python traceback on stderr
  weak        anything else: another exit code, several lines
  working     no answer within the timeout and no error yet: the command started its work (a benchmark on
              values it accepted); listed, to be read by a person (a hang looks the same)

    git clone -q . /tmp/round && cd /tmp/round && python tools/generated_round.py
    ROUND_ONLY=prepare,hf-eval python tools/generated_round.py   # only the tries whose label starts so
    ROUND_PROCESSES=150 python tools/generated_round.py          # 150 tries spread over the round, each a real
                                                                 # `python run.py …` process (exit status, streams)

A try whose store holds a run left RUNNING afterwards is classified ``left RUNNING``, whatever it printed.
With ROUND_RUN_ACCEPTED=1 every config try that ``check`` accepted is then run (two steps of the small model):
``ran`` (exit 0), or what it ended as — a run that ``check`` accepted and that then ends in a one-line refusal is
listed as ``run refused``, for a person to read (check and run deciding differently, or a runtime fault such as
divergence, which no check can foresee).

Run it from a clone: a command that accepts its input writes where its defaults say (results/, bench-out/).
Config tries use ``check`` (nothing trains). Prints every try that is not "one line" or "accepted" (the accepted
too with ROUND_SHOW_ACCEPTED=1), then the counts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG_VALUES = ["abc", "-1", "0", "1e300", "nan", "99999999999999999999", "null", "[]", "{{a:1}}"]  # {{ }}: format
FLAG_VALUES = ["", "-1", "0", "nan", "inf", "1e300", "abc", "99999999999999999999", "/proc/posbench", "{file}",
               "{missing}/x"]
GROUPS = ("pos", "attn", "task", "data", "tokenizer", "model", "optim", "trainer")
SMALL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "data.batch_size=4",
         "data.seq_len=32", "trainer.max_steps=2"]
# what each command needs besides the flag tried (its required arguments), "{…}" filled per try
BASES = {
    ("report",): ["report", "--out", "{tmp}/out", "--tracking-uri", "{store}"],
    ("paper",): ["paper", "--preset", "grid", "--tracking-uri", "{store}", "--out", "{tmp}/out"],
    ("tune",): ["tune", "--out", "{tmp}/out", "--tracking-uri", "{store}"],
    ("index",): ["index", "--dir", "{tmp}/index"],
    ("bench",): ["bench", "--out", "{tmp}/bench"],
    ("bench", "gpu"): ["bench", "gpu", "--out", "{tmp}/gpu"],
    ("bench", "loader"): ["bench", "loader", "--dir", "{tmp}"],
    ("bench", "attention"): ["bench", "attention"],
    ("prepare",): ["prepare", "{tmp}/shards", "data=text", "data.path={words}"],
    ("hf-eval",): ["hf-eval", "{model}", "--check", "--tracking-uri", "{store}"],
}


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


@functools.cache
def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Each command's parser, caught as the command asks it to parse (nothing else runs)."""
    from harness import main as posbench

    def caught(self, *_, **__):
        raise _Captured(self)

    found = {}
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = caught  # type: ignore[method-assign]
    try:
        for key in BASES:
            head = [key[0], *key[1:]] if key[0] == "bench" else [key[0]]
            try:
                posbench.COMMANDS[key[0]](head[1:])
            except _Captured as c:
                parser = c.parser
                for action in parser._actions:  # results' subcommands
                    if isinstance(action, argparse._SubParsersAction):
                        parser = action.choices[key[0]]
                found[key] = parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    return found


def flag_tries() -> list[tuple[str, list[str]]]:
    tries = []
    for key, parser in parsers().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue  # positionals are in the bases; switches take no value
            flag = action.option_strings[-1]
            base = [a for a in BASES[key]]
            if flag in base:  # the base's own value replaced
                i = base.index(flag)
                del base[i:i + 2]
            for value in FLAG_VALUES:
                tries.append((f"{' '.join(key)} {flag}={value!r}", [*base, flag, value]))
    return tries


def config_tries() -> list[tuple[str, list[str]]]:
    """Every leaf key of each group's every option, each hostile value, under ``check``."""
    from omegaconf import OmegaConf

    from harness.config.load import compose
    from harness.paths import CONF

    seen, tries = set(), []
    for group in GROUPS:
        for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
            cfg = OmegaConf.to_container(compose([f"{group}={option}"])[group], resolve=False)
            for leaf in _leaves(cfg, group):
                if leaf in seen or leaf.rsplit(".", 1)[-1].startswith("_"):
                    continue
                seen.add(leaf)
                for value in CONFIG_VALUES:
                    tries.append((f"{group}={option} {leaf}={value}", ["check", *SMALL, f"{group}={option}",
                                                                         f"{leaf}={value}"]))
    return tries


def _leaves(node, prefix: str):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}")
    else:
        yield prefix


def classify(reply: dict) -> str:
    err = reply["stderr"]
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line and "[HYDRA]" not in line
             and "Warning" not in line and not line.startswith(("  warnings.warn", "  return F."))
             and not re.match(r"^/\S+\.py:\d+: ", line)]  # a library's warning (warnings.showwarning's form)
    if reply.get("working"):
        return "working"
    if "Traceback" in err:
        return "traceback"
    if reply["code"] == 0:
        return "accepted"
    if reply["code"] in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
        return "one line"
    return "weak"


def inputs(work: Path) -> dict[str, Path]:
    """The files the tries point at, written into ``work``: a plain file, a small text, a tiny Llama folder."""
    from tests.helpers import tiny_llama

    (work / "a_file").write_text("x")
    (work / "words.txt").write_bytes(b"alpha beta gamma delta " * 4600)
    return {"file": work / "a_file", "missing": work / "missing", "words": work / "words.txt",
            "model": tiny_llama(work / "llama")}


def attempt(inprocess, argv: list[str], folder: Path, files: dict[str, Path], timeout: float) -> dict:
    """One try in ``folder`` with its own store, through posbench's entry function (tests/inprocess.py)."""
    fill = {**files, "tmp": folder, "store": f"sqlite:///{folder / 'mlflow.db'}"}
    argv = [a.format(**fill) for a in argv]
    try:
        return inprocess.run("run", argv, str(folder), {"MLFLOW_TRACKING_URI": fill["store"]}, timeout)
    except inprocess.Hung:
        return {"code": None, "stderr": "", "stdout": "", "working": True}


def attempt_process(argv: list[str], folder: Path, files: dict[str, Path], timeout: float) -> dict:
    """One try as a user's process: ``python run.py ARGV`` in ``folder`` with its own store."""
    import subprocess

    fill = {**files, "tmp": folder, "store": f"sqlite:///{folder / 'mlflow.db'}"}
    argv = [a.format(**fill) for a in argv]
    run_py = Path(__file__).resolve().parents[1] / "run.py"
    env = {**os.environ, "MLFLOW_TRACKING_URI": fill["store"]}
    try:
        done = subprocess.run([sys.executable, str(run_py), *argv], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"code": None, "stderr": "", "stdout": "", "working": True}
    return {"code": done.returncode, "stderr": done.stderr, "stdout": done.stdout}


def left_running(folder: Path) -> int:
    """Runs the try's store holds in status RUNNING (none may be, once a command has answered)."""
    import sqlite3

    store = folder / "mlflow.db"
    if not store.exists():
        return 0
    with contextlib.closing(sqlite3.connect(store)) as db:
        try:
            return db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
        except sqlite3.OperationalError:  # a store with no tables yet
            return 0


def is_typed(label: str) -> bool:
    """Whether the flag of a flag try's ``label`` parses its value as a number (its parser declares a type)."""
    key, flag = label.split(" --")[0], "--" + label.split(" --")[1].split("=")[0]
    parser = parsers()[tuple(key.split())]
    action = next(a for a in parser._actions if flag in a.option_strings)
    return action.type not in (None, str)


def main() -> int:
    from tests import inprocess

    timeout = float(os.environ.get("ROUND_TIMEOUT", "20"))
    work = Path(tempfile.mkdtemp(prefix="posbench-round-"))
    files = inputs(work)
    tries = [*flag_tries(), *config_tries()]
    only = os.environ.get("ROUND_ONLY")  # comma-separated label prefixes: ROUND_ONLY=prepare,hf-eval,pos=
    if only:
        tries = [t for t in tries if t[0].startswith(tuple(only.split(",")))]
    processes = int(os.environ.get("ROUND_PROCESSES", "0"))
    if processes:  # a sample spread evenly over the round, each try a real process
        tries = [tries[round(i * len(tries) / processes)] for i in range(min(processes, len(tries)))]
        timeout = max(timeout, 60.0)  # a fresh interpreter's imports come first
    counts: collections.Counter[str] = collections.Counter()
    print(f"{len(tries)} tries{' as processes' if processes else ''}", flush=True)
    for i, (label, argv) in enumerate(tries):
        tmp = work / f"try{i}"
        tmp.mkdir()
        reply = attempt_process(argv, tmp, files, timeout) if processes else \
            attempt(inprocess, argv, tmp, files, timeout)
        kind = "left RUNNING" if left_running(tmp) else classify(reply)
        if kind == "accepted" and argv[0] == "check" and os.environ.get("ROUND_RUN_ACCEPTED"):
            run_argv = ["run", *argv[1:], "trainer.val_check_interval=2", "data.eval_batches=1",
                        "trainer.enable_progress_bar=false", "checkpoint.every_n_steps=0", f"hydra.run.dir={tmp}/run"]
            reply = attempt(inprocess, run_argv, tmp, files, max(timeout, 120.0))
            ran = "left RUNNING" if left_running(tmp) else classify(reply)
            kind = {"accepted": "ran", "one line": "run refused"}.get(ran, f"run {ran}")
        counts[kind] += 1
        shown = kind not in ("one line", "accepted", "ran")
        if shown or (kind in ("accepted", "ran") and os.environ.get("ROUND_SHOW_ACCEPTED")):
            tail = " | ".join(reply["stderr"].strip().splitlines()[-2:])[:300]
            print(f"{kind:<9} {label}  →  exit {reply['code']}: {tail}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(", ".join(f"{k} {v}" for k, v in counts.most_common()), f"(of {len(tries)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
