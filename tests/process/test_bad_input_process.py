"""Bad input as real processes: a sample of the table's rows (tests/bad_input_table.py) as ``python run.py …`` /
``python -m …`` in fresh interpreters prints the same line with the same exit code as the row run in-process;
Hydra's own error path, HYDRA_FULL_ERROR, a write failure and a full disk under a sweep, the allocator's setting, a
--matrix mistake (all of them: tests/unit/test_bad_input.py), a damaged corpus or vocabulary cache ($POSBENCH_CACHE).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import inprocess
from tests.bad_input_table import (
    LISTING_CASES,
    QUICK,
    ROWS,
    assert_one_line_error,
    prepare_inputs,
    row_request,
    runs_in,
)
from tests.helpers import HANG, ROOT


@pytest.fixture(scope="module")
def files(tmp_path_factory, _empty_store) -> Path:
    """The inputs the sampled rows name (not the models, stores and shards the other rows read)."""
    return prepare_inputs(tmp_path_factory.mktemp("inputs"), _empty_store, [r for r in ROWS if r[1] in FRESH_SAMPLE])


def run_py(args: list[str], store: str, tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *QUICK, f"hydra.run.dir={tmp_path}/run", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG,
        env={**os.environ, "MLFLOW_TRACKING_URI": store, **env},
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["optim.optimizer.lr=-1"], "optim.optimizer.lr=-1 must be positive"),  # ours, before Hydra's app
        (["hydra.run.dir=/proc/posbench"], "cannot write /proc/posbench"),  # Hydra creating its output dir
    ],
    ids=["config-error", "unwritable-output-dir"],  # Hydra's own error (pos=foo): FRESH_SAMPLE's unknown-pos
)
def test_subprocess_exit_status_and_stderr(args, needle, store, tmp_path):
    proc = run_py(args, store, tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, needle)
    assert runs_in(store) == [] and not (tmp_path / "run").exists()  # no run, no output folder


def test_hydra_full_error_keeps_the_traceback(store, tmp_path):
    proc = run_py(["pos=foo"], store, tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "Could not find 'pos/foo'" in proc.stderr


FRESH_SAMPLE = [
    "unknown-pos",  # Hydra's error, before our code runs
    "lr-nan",
    "plus-typo-data",
    "seed-negative",
    "store-server-not-there",
    "eval-length-beyond-split",
    "results-unknown-preset",
    "hf-parquet-damaged",  # the datasets library logs through its own handlers: none of its lines may come first
]


@pytest.mark.parametrize("row_id", FRESH_SAMPLE)
def test_in_process_rows_match_fresh_interpreters(row_id, files, _empty_store, tmp_path):
    """Calling the entry function in this interpreter changes nothing a user sees: the same row as a real command
    in a new interpreter prints the same line (the row's one-line refusal), with the same exit code, and makes no
    run."""
    row = next(r for r in ROWS if r[1] == row_id)
    request = row_request(row, files, _empty_store, tmp_path)
    reply = inprocess.run(row[0], request["argv"], request["cwd"], request["env"], request["timeout"])
    request = row_request(row, files, _empty_store, tmp_path)  # a fresh copy of the empty store
    head = [str(ROOT / "run.py")] if row[0] == "run" else ["-m", row[0]]
    proc = subprocess.run(
        [sys.executable, *head, *request["argv"]],
        capture_output=True,
        text=True,
        cwd=request["cwd"],
        env={**os.environ, **request["env"]},
        timeout=HANG,
    )
    assert (proc.returncode, proc.stderr.strip()) == (reply["code"], reply["stderr"].strip())
    assert reply["code"] == 2
    assert_one_line_error(proc.returncode, proc.stderr, row[3])
    assert runs_in(request["env"]["MLFLOW_TRACKING_URI"]) == []


def test_a_write_failure_mid_run_is_one_line(_empty_store, tmp_path):
    """A file-size limit (as a full disk would) stops the store's writes: one line saying what to free and how
    to go on, exit 1, no traceback."""
    import resource

    db = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, db)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (db.stat().st_size // 2, resource.RLIM_INFINITY))  # no page past it

    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *QUICK, f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG,
        preexec_fn=limit,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "INFO mlflow" not in line]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: writing failed: "), lines
    assert "resume=true" in lines[0]


def test_a_listing_mistake_in_a_fresh_interpreter_is_the_same_line(tmp_path):
    """--matrix and --list refuse outside Hydra's app (harness/cli.py); tests/unit/test_bad_input.py runs each of
    their mistakes in-process. One as a real command (the one that imports what the user named) prints the same
    line with the same exit code, and nothing on stdout."""
    _, args, needle = next(c for c in LISTING_CASES if c[0] == "matrix-target")
    reply = inprocess.run("run", args, str(tmp_path), {}, HANG)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, cwd=tmp_path, timeout=HANG
    )
    assert (proc.returncode, proc.stderr.strip()) == (reply["code"], reply["stderr"].strip())
    assert_one_line_error(proc.returncode, proc.stderr, needle)
    assert proc.stdout == ""


def test_an_unknown_allocator_setting_is_refused(store, tmp_path):
    proc = run_py([], store, tmp_path, POSBENCH_MALLOC="jemalloc")
    assert_one_line_error(proc.returncode, proc.stderr, "POSBENCH_MALLOC='jemalloc': use POSBENCH_MALLOC=system")


def test_a_full_disk_stops_a_sweep_at_its_first_cell_in_one_line(_empty_store, tmp_path):
    """A file-size limit that lets the sweep's parent run be made but not its first cell's writes (a disk filling
    up): one line, exit 1, the later cells not attempted, and no cell of the sweep left RUNNING."""
    import resource

    db = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, db)
    room = db.stat().st_size + 48 * 1024  # the parent run's few pages, not a cell's params, metrics and checkpoint

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))

    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            *QUICK,
            "pos=rope,learned,t5",
            f"hydra.sweep.dir={tmp_path}/sweep",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG,
        preexec_fn=limit,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
    )
    lines = [
        line
        for line in proc.stderr.splitlines()
        if line.strip() and "INFO mlflow" not in line and "[HYDRA]" not in line
    ]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: writing failed: ") and "the sweep stops" in lines[0], lines
    assert "#1 : pos=learned" not in proc.stdout + proc.stderr  # the second cell was never launched
    with sqlite3.connect(db) as con:
        statuses = [s for (s,) in con.execute("select status from runs")]
    assert statuses.count("RUNNING") <= 1  # at most the parent, closed by the next sweep (close_dead_runs)


# The caches posbench writes outside a run's folder ($POSBENCH_CACHE, read when the process starts: real processes),
# each built here as a first run builds it (in this process, the cache pointed at a folder; the corpus copied from
# this machine's cache, which any run builds once: parsing the stdlib again costs seconds) and then one byte of it
# flipped: the next command's one line names the file and says to delete it (the next run builds it again), before
# any run is made.
CACHES = {
    "corpus-cache-flipped": ([], "stdlib-prose-*.txt", "is damaged"),
    "vocabulary-cache-flipped": (
        ["data=text", "data.path={words}", "tokenizer=bpe", "tokenizer.vocab_size=300", "task=clm"],
        "tokenizers/bpe-v300-*.json",
        "the cached vocabulary was damaged",
    ),
}


@pytest.mark.parametrize("kind", CACHES)
def test_a_damaged_cache_is_refused_by_the_next_command_in_one_line(kind, store, tmp_path, monkeypatch):
    args, pattern, needle = CACHES[kind]
    (tmp_path / "words.txt").write_bytes(b"alpha beta gamma delta " * 4600)
    args = [a.format(words=tmp_path / "words.txt") for a in args]
    cache = tmp_path / "cache"
    from harness.data import corpus
    from harness.data.subword import BPE

    if kind == "corpus-cache-flipped":
        corpus.Embedded().sizes()  # this machine's cache, built if it is not there yet
        cache.mkdir()
        for made in corpus.CACHE.glob(f"stdlib-prose-{'.'.join(map(str, sys.version_info[:3]))}.txt*"):
            shutil.copyfile(made, cache / made.name)  # the text and its seal
    monkeypatch.setattr(corpus, "CACHE", cache)
    if kind == "corpus-cache-flipped":
        corpus.Embedded().load()  # checks the copy's seal (or builds it, had nothing matched)
    else:
        BPE(vocab_size=300).fit(corpus.TextFiles(str(tmp_path / "words.txt")).load())
    (built,) = cache.glob(pattern)
    data = bytearray(built.read_bytes())
    data[len(data) // 2] ^= 0x01
    built.write_bytes(bytes(data))
    proc = run_py(args, store, tmp_path, POSBENCH_CACHE=str(cache))
    assert_one_line_error(proc.returncode, proc.stderr, needle)
    assert built.name in proc.stderr and "delete" in proc.stderr
    assert runs_in(store) == []
