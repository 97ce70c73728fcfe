"""Bad input, for every entry point: one line on stderr naming the problem and the fix, exit code 2,
no traceback, nothing on stdout, and no MLflow run created (so none left RUNNING); and the same one line for
--matrix/--list mistakes, damage a run meets as it reads, and a run that diverged.

Each row of the table (tests/bad_input_table.py) calls the entry function a user's command calls
(``posbench``/``run.py``'s ``harness.main.main``, ``python -m results``'s and ``python -m harness.bench``'s ``main``)
in this interpreter (tests/inprocess.py): the same code, without a process's imports per row. What only a real
process shows is in tests/process/test_bad_input_process.py.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import inprocess
from tests.bad_input_table import (
    DURING_RUN_CASES,
    LISTING_CASES,
    QUICK,
    ROWS,
    assert_one_line_error,
    prepare_inputs,
    row_request,
    run_count,
    runs_in,
)
from tests.helpers import HANG


@pytest.fixture(scope="module")
def files(tmp_path_factory, _empty_store) -> Path:
    return prepare_inputs(tmp_path_factory.mktemp("inputs"), _empty_store)


@pytest.fixture(scope="module")
def reply(files, _empty_store, tmp_path_factory):
    """reply(row): the row's command in its own folder with its own copy of the empty store, in this interpreter
    (forked processes cost more CPU than they saved)."""

    def one(row) -> dict:
        tmp = tmp_path_factory.mktemp(row[1])
        request = row_request(row, files, _empty_store, tmp)
        out = inprocess.run(row[0], request["argv"], request["cwd"], request["env"], request["timeout"])
        return {**out, "runs": run_count(tmp / "mlflow.db"), "left": sorted(p.name for p in tmp.iterdir())}

    return one


@pytest.mark.parametrize("row", ROWS, ids=[r[1] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_no_run(row, reply):
    got = reply(row)
    assert_one_line_error(got["code"], got["stderr"], row[3])
    assert got["stdout"].strip() == ""
    assert got["runs"] == 0  # refused before any MLflow run was created (tests/inprocess.py guards against a hang)
    assert set(got["left"]) <= {"mlflow.db", "mlflow.db.lock"}  # nothing written beside the store and its lock:
    # refused before Hydra's app made the run's output folder, and before a checkpoint folder was made


@pytest.mark.parametrize("case", DURING_RUN_CASES, ids=[c[0] for c in DURING_RUN_CASES])
def test_damage_met_while_a_run_reads_is_one_line_and_the_run_closed_failed(case, files, _empty_store, tmp_path):
    request = row_request(("run", *case), files, _empty_store, tmp_path)
    reply = inprocess.run("run", request["argv"], request["cwd"], request["env"], request["timeout"])
    assert_one_line_error(reply["code"], reply["stderr"], case[2])
    (run,) = runs_in(request["env"]["MLFLOW_TRACKING_URI"])
    assert run.info.status == "FAILED"
    assert run.data.tags["failure_reason"].endswith(f"ConfigError: {reply['stderr'].strip().removeprefix('error: ')}")


@pytest.mark.parametrize("case", LISTING_CASES, ids=[c[0] for c in LISTING_CASES])
def test_matrix_and_list_mistakes_are_one_line_on_stderr(case, tmp_path):
    """``python run.py --matrix|--list`` mistakes: the line on stderr and nothing on stdout (one of them is also
    run as a real command: tests/process/test_bad_input_process.py)."""
    _, args, needle = case
    reply = inprocess.run("run", args, str(tmp_path), {}, HANG)
    assert_one_line_error(reply["code"], reply["stderr"], needle)
    assert reply["stdout"] == ""


def test_a_diverged_run_is_one_line_naming_the_step_and_the_fix(store, tmp_path):
    """Not bad input (the run trained, and is recorded FAILED with failure=diverged), but the same promise:
    one line, no traceback. What the command prints and records, not its process: run.py's entry function here."""
    argv = [*QUICK, f"hydra.run.dir={tmp_path}/run", "optim.optimizer.lr=1e10"]
    reply = inprocess.run("run", argv, str(tmp_path), {"MLFLOW_TRACKING_URI": store}, HANG)
    lines = [line for line in reply["stderr"].splitlines() if line.startswith("error: ")]
    assert reply["code"] == 1 and "Traceback" not in reply["stderr"], reply["stderr"][-2000:]
    assert len(lines) == 1 and "training diverged: the loss is nan at step 1" in lines[0], lines
    assert "lower optim.optimizer.lr" in lines[0] and lines[0].endswith("the run is closed FAILED")
    (run,) = runs_in(store)
    assert run.info.status == "FAILED" and run.data.tags["failure"] == "diverged"


def test_the_multirun_flag_may_follow_overrides(store, tmp_path):
    """Hydra's parser takes -m before the overrides only; run.py moves it there (and checks the sweep)."""
    argv = [*QUICK, f"hydra.run.dir={tmp_path}/run", "attn=softmax", "-m", "pos=rope,foo"]
    reply = inprocess.run("run", argv, str(tmp_path), {"MLFLOW_TRACKING_URI": store}, HANG)
    assert_one_line_error(reply["code"], reply["stderr"], "Could not find 'pos/foo'")


def test_at_least_100_kinds():
    ids = [r[1] for r in ROWS]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)


def test_learned_table_refuses_a_longer_sequence_with_the_fix():
    """A longer input than pos=learned's table is refused (eval.lengths records it as skipped,
    see test_sweep); the refusal is itself a one-line ConfigError naming the fix."""
    from functools import partial

    import torch

    from attention.softmax import Softmax
    from harness.errors import ConfigError
    from harness.model.transformer import ModelConfig, Transformer
    from positional.learned import Learned

    model = Transformer(
        ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32),
        258,
        8,
        False,
        pos=partial(Learned),
        attn=partial(Softmax),
    )
    with pytest.raises(ConfigError, match="has 8 positions but the input needs 16; train with a longer") as e:
        model(torch.zeros(1, 16, dtype=torch.long), torch.ones(1, 16, dtype=torch.bool))
    assert "\n" not in str(e.value)


def test_concurrent_checks_of_one_output_folder_all_pass_and_leave_nothing(tmp_path):
    """Two benches with the default --out check the same folder at once: each check writes only in a scratch
    folder of its own, so neither removes what the other's check reads."""
    from harness.record.preflight import output_dir

    target, barrier = tmp_path / "bench-out", threading.Barrier(16)

    def check(_):
        barrier.wait()
        return [output_dir(target) for _ in range(50)]

    with ThreadPoolExecutor(16) as pool:
        checked = [p for batch in pool.map(check, range(16)) for p in batch]
    assert set(checked) == {target}
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing left
