"""ablation: the tests that start real processes (the rest: tests/unit/test_ablation.py).

``make run``'s default ablation (conf/experiment/ablation.yaml): pos=none, learned, rope × 3 seeds, its cells
side by side in worker processes, ending with a verdict per scheme against pos=none. A shortened run (a smaller
model, fewer steps) is read back from MLflow: every cell trained once under the sweep's parent, and the verdict
lines the sweep printed are the ones the store's numbers give (a Welch interval recomputed from the final losses,
a premature arm's order-gain curve).
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests import inprocess
from tests.helpers import HANG, ROOT

# the preset at TINY's width, batch and validation size (tests/helpers.py), so nine cells train quickly: too short for
# RoPE to use word order; three validations, so each cell has a loss and order-gain curve (a verdict's trend reads
# the last two points)
SHORT = [
    "model.d_model=32",
    "model.d_ff=64",
    "data.seq_len=32",
    "data.batch_size=8",
    "data.eval_batches=2",
    "trainer.max_steps=6",
    "trainer.val_check_interval=2",
    "optim.schedule.warmup_steps=1",
    "trainer.enable_progress_bar=false",
]


@pytest.fixture(scope="module")
def shortened(tmp_path_factory, _empty_store):
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("ablation")
    shutil.copyfile(_empty_store, tmp / "mlflow.db")  # a migrated store: the sweep's process would migrate a new one
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "experiment=ablation", *SHORT, f"hydra.sweep.dir={tmp / 'multirun'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, MlflowClient(tracking_uri=uri)


def test_every_cell_trains_once_as_a_child_of_the_sweep(shortened):
    """The preflight checks the cells in this process whatever launcher the preset picks: with the preset's
    joblib workers it once trained all nine before the sweep began, then the sweep adopted them as finished."""
    proc, client = shortened
    assert "skipped:" not in proc.stdout and "no mlflow_sweep.json" not in proc.stderr
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r is not parent]
    assert len(children) == 9 and {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert {(r.data.tags["pos"], r.data.tags["seed"]) for r in children} == {
        (p, s) for p in ("none", "learned", "rope") for s in "012"
    }
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert min(r.info.start_time for r in children) >= parent.info.start_time  # trained within the sweep
    for r in children:  # an MLM loss curve per cell: a validation every 2 steps
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val/loss")] == [2, 4, 6]


def test_the_printed_verdicts_are_the_stores_numbers(shortened):
    from harness.stats import welch_interval
    from results.cells import MIN_ORDER_GAIN
    from results.report import console_summary
    from results.store import find_sweep, sweep_report
    from results.verdicts import headline, verdicts

    proc, client = shortened
    report = sweep_report(client, find_sweep(client, "posbench"))
    printed = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("Verdict on 2 comparisons"))
    assert printed[start : start + 3] == console_summary(report).splitlines()[-3:]  # headline, then one line each
    found = {v.group.pos: v for v in verdicts(report.groups, MIN_ORDER_GAIN, margin=report.margin)}
    assert report.margin == 0.02  # the preset's, recorded on the parent run when the sweep started
    assert printed[start] == headline(list(found.values()), MIN_ORDER_GAIN, margin=report.margin)
    for line in printed[start + 1 : start + 3]:  # at 6 steps no arm uses word order: both premature, each curve
        pos = line.split()[0]
        assert line.startswith(f"  {pos} vs none (softmax): premature — train longer: order gain ")
        curve = found[pos].group.gain_curve()
        assert [s for s, _ in curve] == [2, 4, 6]
        assert "flat (" + ", ".join(f"{g:.3f}" for _, g in curve) + " at steps 2, 4, 6)" in line or "rising" in line

    # judged on loss alone (a threshold every order gain passes), each line is the Welch interval of the finals
    for v in verdicts(report.groups, -1.0):
        finals = [[c.final_loss for c in g.cells] for g in (v.group, v.baseline)]
        diff, low, high = welch_interval(*finals)
        numbers = re.search(r"Δ = (\S+) \[(\S+), (\S+)\]", v.text).groups()
        assert numbers == (f"{diff:+.4f}", f"{low:+.4f}", f"{high:+.4f}")
        assert v.verdict == ("lower" if high < 0 else "higher" if low > 0 else "inconclusive")


def test_a_checked_sweep_checks_every_cell_in_this_process_whatever_launcher_the_preset_picks(tmp_path):
    """``--check -m experiment=ablation`` once handed the cells to the preset's joblib workers, which were not in
    check mode and trained all nine (minutes, a store full of runs); now it answers in seconds, trains nothing."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # run.py's entry function in this interpreter (tests/inprocess.py): the test reads what the command printed and
    # wrote; a cell handed to a joblib worker would still train there, into this store
    for launcher in ([], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]):
        argv = ["-m", "--check", "experiment=ablation", *launcher, f"hydra.sweep.dir={tmp_path / 'multirun'}"]
        done = inprocess.run("run", argv, str(ROOT), {"MLFLOW_TRACKING_URI": uri}, HANG)
        assert done["code"] == 0, done["stderr"][-2000:]
        assert done["stdout"].count("ok: ") == 9, done["stdout"]
        assert not (tmp_path / "mlflow.db").exists()  # no cell trained: training opens the store first
