"""Bad input: one line on stderr naming the problem and the fix, exit code 2, quickly, no
traceback, and no MLflow run (so none left RUNNING).

Most kinds run in-process: run.py's ``__main__`` block executed with ``runpy`` — exactly what
``python run.py`` runs, Hydra included — because a subprocess costs ~5 s of imports; a few
run as real subprocesses to check the process boundary (exit status, nothing else printed).
"""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY

QUICK = [*TINY, "trainer.max_steps=2"]

# (id, overrides — "{files}" is a directory of prepared inputs, see `files` —, text the line must contain)
CASES = [
    ("unknown-pos", ["pos=foo"], "Could not find 'pos/foo'; use one of pos=alibi, cope, fire, kerple, learned"),
    ("unknown-attn", ["attn=foo"], "Could not find 'attn/foo'; use one of attn=linear, local, performer, softmax"),
    ("unknown-task", ["task=foo"], "use one of task=clm, mlm"),
    ("unknown-key", ["model.foo=1"], "Could not override 'model.foo'"),
    ("override-syntax", ["model.d_model=["], "cannot parse override 'model.d_model=['"),
    ("heads-divide-d_model", ["model.n_heads=3"], "not divisible by model.n_heads=3; change one"),
    ("odd-rope-head-dim", ["model.d_model=6"], "1.0 × 3 is not a positive even integer"),
    ("window-over-length", ["attn=local", "attn.window=64"], "attn.window=64 exceeds data.seq_len=32"),
    ("window-zero", ["attn=local", "attn.window=0"], "attn.window=0 must be a positive integer"),
    ("window-negative", ["attn=local", "attn.window=-4"], "attn.window=-4 must be a positive integer"),
    ("lr-negative", ["optim.optimizer.lr=-1"], "optim.optimizer.lr=-1 must be positive"),
    ("lr-zero", ["optim.optimizer.lr=0"], "optim.optimizer.lr=0 must be positive"),
    ("steps-zero", ["trainer.max_steps=0"], "trainer.max_steps=0 must be a positive integer"),
    ("steps-not-a-number", ["trainer.max_steps=abc"], "trainer.max_steps='abc' must be an integer"),
    ("batch-zero", ["data.batch_size=0"], "data.batch_size=0 must be a positive integer"),
    ("batch-negative", ["data.batch_size=-8"], "data.batch_size=-8 must be a positive integer"),
    ("seq-len-zero", ["data.seq_len=0"], "data.seq_len=0 must be a positive integer"),
    ("seed-not-a-number", ["seed=abc"], "seed='abc' must be an integer"),
    ("mask-prob-zero", ["task.mask_prob=0"], "task.mask_prob=0 must lie in (0, 1)"),
    ("mask-prob-over-one", ["task.mask_prob=1.5"], "task.mask_prob=1.5 must lie in (0, 1)"),
    ("dropout-over-one", ["model.dropout=1.5"], "model.dropout=1.5 must lie in [0, 1)"),
    ("unknown-decay", ["optim.schedule.decay=foo"], "use cosine, linear or constant"),
    ("t5-odd-buckets", ["pos=t5", "pos.num_buckets=5"], "pos.num_buckets=5 must be even"),
    ("unknown-backend", ["attn.backend=foo"], "attn.backend='foo' is unknown"),
    ("eval-batches-zero", ["data.eval_batches=0"], "data.eval_batches=0 must be positive"),
    ("eval-lengths-negative", ["eval.lengths=[128,-5]"], "[-5] are not positive integers"),
    ("eval-lengths-not-numbers", ["eval.lengths=[abc]"], "['abc'] are not positive integers"),
    ("incompatible-pairing", ["pos=xl", "attn=local"], "incompatible pairing: attn=local cannot apply a content"),
    ("text-without-path", ["data=text"], "data=text needs a file or directory: add data.path="),
    ("missing-corpus", ["data=text", "data.path={files}/nope.txt"], "does not exist; point it at a UTF-8 text"),
    ("empty-corpus", ["data=text", "data.path={files}/empty.txt"], "holds 0 bytes; give at least 4 KiB"),
    ("non-utf8-corpus", ["data=text", "data.path={files}/latin1.txt"], "is not UTF-8 (bad byte at offset"),
    ("window-longer-than-corpus", ["data=text", "data.path={files}/small.txt", "data.seq_len=8192",
                                   "model.n_heads=2"], "not more than one window of 8192; lower data.seq_len"),
    ("no-validation-split", ["data=text", "data.path={files}/small.txt"], "the validation split has 0 tokens"),
    ("enwik8-wrong-checksum", ["data=enwik8", "data.path={files}/small.txt"], "is not enwik8 (sha256"),
    ("enwik8-missing-no-download", ["data=enwik8", "data.path={files}/nope", "data.download=false"],
     "not found; set data.path=/path/to/enwik8 or data.download=true"),
    ("tracking-uri-relative", ["logger.tracking_uri=sqlite:///rel.db"], "is not sqlite:////absolute/path.db"),
    ("tracking-uri-scheme", ["logger.tracking_uri=foo://bar"], "has scheme 'foo', which MLflow cannot open"),
    ("tracking-uri-no-host", ["logger.tracking_uri=http://"], "names no host"),
    ("store-dir-unwritable", ["logger.tracking_uri=sqlite:///{files}/empty.txt/mlflow.db"],
     "logger.tracking_uri: cannot create"),
    ("output-dir-unwritable", ["hydra.run.dir={files}/empty.txt/run"], "cannot write"),
    ("checkpoint-dir-unwritable", ["checkpoint.dir={files}/empty.txt/ckpt"], "checkpoint.dir: cannot create"),
    ("checkpoint-every-negative", ["checkpoint.every_n_steps=-1"], "checkpoint.every_n_steps=-1 must be"),
    ("resume-without-checkpoint", ["resume=true"], "resume=true: no checkpoint for this config"),
    ("resume-missing-file", ["resume={files}/step-4.ckpt"], "no such checkpoint; use resume=true"),
    ("resume-foreign-checkpoint", ["resume={files}/foreign/step-4.ckpt"], "was written by another config"),
    ("resume-bad-value", ["resume=maybe"], "resume='maybe': use resume=true, resume=auto"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    (d / "empty.txt").write_bytes(b"")
    (d / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e ".encode("latin-1") * 500)
    (d / "small.txt").write_bytes(b"a small but valid UTF-8 text file. " * 200)  # 7 KB: one val block short
    (d / "foreign").mkdir()
    (d / "foreign" / "step-4.ckpt").write_bytes(b"not ours")
    (d / "foreign" / "run.json").write_text('{"run_id": "x", "config_hash": "0", "tracking_uri": "", "experiment": ""}')
    return d


def run_in_process(args: list[str], tmp_path, monkeypatch, capsys) -> tuple[int, str, float]:
    """``python run.py *args`` without a new interpreter: run.py's own ``__main__`` block (the
    Hydra entry inside harness.cli.run_cli). Run as __main__ so Hydra finds conf/ beside it."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "run.py"), f"hydra.run.dir={tmp_path}/run", *QUICK, *args])
    started = time.perf_counter()
    code = None
    handlers = logging.root.handlers[:]
    try:
        runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code
    finally:  # Hydra points the root logger at this test's captured stderr, closed after it
        logging.root.handlers[:] = handlers
    return code, capsys.readouterr().err, time.perf_counter() - started


def runs_in(store: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("posbench")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def assert_one_line_error(code: int, stderr: str, needle: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
    assert needle in lines[0], lines[0]
    assert any(w in lines[0] for w in ("; ", " use ", " must ", " add "))  # it says what to change


@pytest.mark.parametrize("args, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_no_run(args, needle, files, store, tmp_path, monkeypatch, capsys):
    args = [a.format(files=files) for a in args]
    code, stderr, seconds = run_in_process(args, tmp_path, monkeypatch, capsys)
    assert_one_line_error(code, stderr, needle)
    assert seconds < 10
    assert runs_in(store) == []  # refused before any MLflow run was created


def test_at_least_25_kinds():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


def test_learned_table_refuses_a_longer_sequence_with_the_fix():
    """A longer input than pos=learned's table is refused (eval.lengths records it as skipped,
    see test_sweep); the refusal is itself a one-line ConfigError naming the fix."""
    from functools import partial

    import torch

    from attention.softmax import Softmax
    from harness.errors import ConfigError
    from harness.model import ModelConfig, Transformer
    from positional.learned import Learned

    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32), 258, 8, False,
                        pos=partial(Learned), attn=partial(Softmax))
    with pytest.raises(ConfigError, match="has 8 positions but the input needs 16; train with a longer") as e:
        model(torch.zeros(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=torch.bool))
    assert "\n" not in str(e.value)


def run_py(args: list[str], store: str, tmp_path, **env) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *QUICK, f"hydra.run.dir={tmp_path}/run", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "MLFLOW_TRACKING_URI": store, **env})
    return proc, time.perf_counter() - started


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["pos=foo"], "Could not find 'pos/foo'; use one of pos="),  # Hydra's error, before our code runs
    (["optim.optimizer.lr=-1"], "optim.optimizer.lr=-1 must be positive"),  # ours, inside the task function
    (["hydra.run.dir=/proc/posbench"], "cannot write /proc/posbench"),  # Hydra creating its output dir
], ids=["hydra-missing-option", "config-error", "unwritable-output-dir"])
def test_subprocess_exit_status_and_stderr(args, needle, store, tmp_path):
    proc, seconds = run_py(args, store, tmp_path)
    assert_one_line_error(proc.returncode, proc.stderr, needle)
    assert seconds < 60  # a hang guard, not a timing: refusals take ~5 s of imports on a quiet 2-core machine
    assert runs_in(store) == []


@pytest.mark.slow
def test_hydra_full_error_keeps_the_traceback(store, tmp_path):
    proc, _ = run_py(["pos=foo"], store, tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "Could not find 'pos/foo'" in proc.stderr
