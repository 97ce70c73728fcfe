"""A stopped run tells the truth, as real processes: SIGTERM exits 143 and Ctrl-C (SIGINT) 130, in training
and in the final evaluation; the MLflow run is closed KILLED (never left RUNNING, never FINISHED); one line on
stderr says how to resume; and resume=true (run.py's entry, run in this process) then finishes the same run. A
sweep stopped in a cell or in its report closes its parent KILLED too, and ``posbench prepare`` stopped mid-shard
leaves no partial folder. The tests about which checkpoint a stop keeps stop run.py's entry in this process too:
what they read is the line and the store, not the exit status."""

import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from harness.record.run import alive
from tests import inprocess
from tests.helpers import HANG, ROOT, TINY

STEPS = ["trainer.max_steps=8", "trainer.val_check_interval=5", "checkpoint.every_n_steps=3"]


def stopped_run(
    signal_name: str, phase: str, store: str, tmp_path, *args: str, steps: list[str] = STEPS
) -> subprocess.CompletedProcess:
    sent = tmp_path / "sent"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "signaller.py"),
            signal_name,
            phase,
            str(sent),
            *args,
            *TINY,
            *steps,
            f"hydra.run.dir={tmp_path}/run",
            f"hydra.sweep.dir={tmp_path}/sweep",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG,
        preexec_fn=default_sigint,
    )
    assert sent.exists(), proc.stderr[-3000:]  # the signal was sent in the phase asked for
    return proc


def stopped_here(steps: list[str], store: str, tmp_path, monkeypatch) -> subprocess.CompletedProcess:
    """A SIGTERM in step 4 of run.py's entry run in this process (tests/inprocess.py), the stop armed as
    tests/signaller.py arms it in a real one: for a test about what the stop leaves (the checkpoint kept, the line,
    the resume); the exit status a real process gets is test_a_stopped_run_exits_non_zero_killed_and_resumable's.
    Ctrl-C stays in real processes: Lightning ignores SIGINT from then on in the process it interrupted."""
    from tests.signaller import arm  # here: it imports the training code, which collecting this file need not

    sent = tmp_path / "sent"
    with monkeypatch.context() as patched:
        arm(signal.SIGTERM, "fit", sent, patched.setattr)
        argv = [*TINY, *steps, f"hydra.run.dir={tmp_path}/run"]
        stopped = inprocess.run("run", argv, str(tmp_path), {"MLFLOW_TRACKING_URI": store}, timeout=HANG)
    assert sent.exists(), stopped["stderr"][-3000:]  # the signal was sent in step 4
    return subprocess.CompletedProcess(["run.py", *argv], stopped["code"], stopped["stdout"], stopped["stderr"])


def default_sigint() -> None:
    """Ctrl-C's default disposition in the child, as a terminal gives it: a non-interactive shell starts a
    background job (``make test &``) with SIGINT ignored, which the child would inherit and never see."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signal_name,code", [("TERM", 143), ("INT", 130)])
@pytest.mark.parametrize("phase", ["fit", "evaluation"])
def test_a_stopped_run_exits_non_zero_killed_and_resumable(signal_name, code, phase, store, tmp_path):
    proc = stopped_run(signal_name, phase, store, tmp_path)
    assert proc.returncode == code, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "resume with the same command plus resume=true" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert run.info.status == "KILLED"
    if phase == "fit":  # the signal came in step 4 (global_step 3), after step 3's checkpoint. SIGTERM: step 4
        # ends and is saved then; Ctrl-C interrupts wherever it lands: the last whole checkpoint stays
        assert f"checkpoint holds step {4 if signal_name == 'TERM' else 3}" in errors[0]

    if (signal_name, phase) != ("TERM", "fit"):
        return  # resuming a KILLED run is the same whatever stopped it: once, from the checkpoint SIGTERM saved
    # the stop is what needs a real process; the resume is run.py's own entry in this one (tests/inprocess.py)
    argv = [*TINY, *STEPS, "resume=true", f"hydra.run.dir={tmp_path}/run2"]
    resumed = inprocess.run("run", argv, str(tmp_path), {"MLFLOW_TRACKING_URI": store}, timeout=HANG)
    assert resumed["code"] == 0, resumed["stderr"][-3000:]
    [again] = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"


def test_a_sigterm_during_a_validation_resumes_with_that_validation(store, tmp_path, monkeypatch):
    """The signal comes in step 4, whose validation then stops at its first batch: step 4's checkpoint would resume
    past that validation, so the stopped run keeps step 3's and the resumed run validates at step 4."""
    steps = ["trainer.max_steps=8", "trainer.val_check_interval=4", "checkpoint.every_n_steps=3"]
    proc = stopped_here(steps, store, tmp_path, monkeypatch)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "checkpoint holds step 3" in proc.stderr, proc.stderr[-2000:]
    argv = [*TINY, *steps, "resume=true", f"hydra.run.dir={tmp_path}/run2"]
    resumed = inprocess.run("run", argv, str(tmp_path), {"MLFLOW_TRACKING_URI": store}, timeout=HANG)
    assert resumed["code"] == 0, resumed["stderr"][-3000:]
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == "3"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss")) == [4, 8]


@pytest.mark.parametrize("signal_name, every, code", [("INT", 5, 130), ("TERM", 0, 143)])
def test_a_run_without_a_checkpoint_is_not_told_to_resume(store, tmp_path, monkeypatch, signal_name, every, code):
    """Ctrl-C in step 4 when the first checkpoint would be step 5, or a SIGTERM with checkpoint.every_n_steps=0
    (which writes none, a SIGTERM's included): resume=true would find nothing, so the line says to run the command
    again. The SIGTERM stops run.py's entry in this process (``stopped_here``), Ctrl-C a real one."""
    steps = ["trainer.max_steps=8", "trainer.val_check_interval=5", f"checkpoint.every_n_steps={every}"]
    if signal_name == "TERM":
        proc = stopped_here(steps, store, tmp_path, monkeypatch)
    else:
        proc = stopped_run(signal_name, "fit", store, tmp_path, steps=steps)
    assert proc.returncode == code, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "no checkpoint was written yet; run the same command again" in line and "resume=true" not in line, line


def test_a_sigterm_between_accumulated_micro_batches_resumes_exactly(store, tmp_path, monkeypatch):
    """Two micro-batches a step: the signal comes in step 4's first, after which Lightning stops. A checkpoint
    there would hold step 3 plus half of step 4's batch; the stopped run keeps step 2's, and the resumed run
    ends where an uninterrupted one does."""
    steps = ["trainer.max_steps=8", "trainer.val_check_interval=5", "checkpoint.every_n_steps=2"]
    steps.append("trainer.accumulate_grad_batches=2")
    proc = stopped_here(steps, store, tmp_path, monkeypatch)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "checkpoint holds step 2" in proc.stderr, proc.stderr[-2000:]
    for argv in ([*steps, "resume=true"], steps):  # resumed, then uninterrupted (a new run)
        done = inprocess.run("run", [*TINY, *argv], str(tmp_path), {"MLFLOW_TRACKING_URI": store}, timeout=HANG)
        assert done["code"] == 0, done["stderr"][-3000:]
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("posbench").experiment_id
    resumed, uninterrupted = client.search_runs([experiment], order_by=["attributes.start_time ASC"])
    assert resumed.data.tags["resumed_from_step"] == "2"
    for key in ("train/loss", "val/loss"):
        got, want = (
            sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
            for r in (resumed, uninterrupted)
        )
        assert [s for s, _ in got] == [s for s, _ in want]
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6


@pytest.mark.parametrize("phase", ["fit", "report"])
def test_a_stopped_sweep_closes_its_parent_killed(phase, store, tmp_path):
    """SIGTERM in a cell's training or in the sweep's report: exit 143, one line, the parent KILLED (not FAILED,
    which says the sweep broke), the cell KILLED in training and FINISHED before the report."""
    proc = stopped_run("TERM", phase, store, tmp_path, "-m", "pos=rope")
    assert proc.returncode == 143, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    [cell] = [r for r in runs if r.data.tags.get("sweep_role") != "parent"]
    assert parent.info.status == "KILLED"
    assert cell.info.status == ("KILLED" if phase == "fit" else "FINISHED")


def joblib_sweep_training(store, tmp_path) -> tuple[subprocess.Popen, MlflowClient]:
    """A two-cell joblib sweep (two workers) of cells that train for long, once a cell trains in a worker."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "pos=rope,none",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            *TINY,
            "trainer.max_steps=100000",
            f"hydra.sweep.dir={tmp_path}/sweep",
        ],
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": store},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    client, deadline, training = MlflowClient(store), time.time() + HANG, False
    while not training and time.time() < deadline and proc.poll() is None:  # until a cell trains in a worker
        exp = client.get_experiment_by_name("posbench")
        runs = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'") if exp else []
        training = any(
            r.data.tags.get("sweep_role") != "parent" and r.data.tags.get("pid") != str(proc.pid) for r in runs
        )
        time.sleep(0 if training else 1)
    assert training, "no cell started training in a worker before the sweep was to be stopped"
    return proc, client


def test_a_stopped_joblib_sweep_leaves_no_cell_running(store, tmp_path):
    """SIGTERM to the sweep's own process (``kill PID``), not to its joblib workers: the workers never see it and
    the launcher tears them down, so the sweep closes the cells they were training KILLED itself — no run is left
    RUNNING — and exits 143 with one line."""
    proc, client = joblib_sweep_training(store, tmp_path)
    proc.terminate()
    stderr = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 143, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "Traceback" not in stderr, stderr[-3000:]
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    cells = [r for r in runs if r.data.tags.get("sweep_role") != "parent"]
    assert parent.info.status == "KILLED" and cells
    assert {r.info.status for r in cells} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in cells]


def test_a_killed_joblib_sweeps_workers_stop_their_cells(store, tmp_path):
    """SIGKILL to the sweep's process (the OOM killer's way): it cannot stop its workers, so each worker watches
    it and, once it is gone, stops its cell as SIGTERM does: the cell closed KILLED, the worker exited — none
    trains on with no parent."""
    proc, client = joblib_sweep_training(store, tmp_path)
    proc.kill()
    proc.wait(timeout=HANG)  # not its stderr: the workers hold it open until they exit
    proc.stderr.close()
    experiment = client.get_experiment_by_name("posbench").experiment_id
    deadline, cells = time.time() + HANG, []
    while time.time() < deadline:
        cells = [r for r in client.search_runs([experiment]) if r.data.tags.get("sweep_role") != "parent"]
        workers = {int(r.data.tags["pid"]) for r in cells}
        if cells and all(r.info.status != "RUNNING" for r in cells) and not any(map(alive, workers)):
            break
        time.sleep(1)
    assert cells and {r.info.status for r in cells} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in cells]
    assert not any(alive(int(r.data.tags["pid"])) for r in cells), "a worker outlived its killed sweep"


PROGRAM = """
import os, signal, sys, weakref
from harness.signals import exit_code, terminating

class Thing:
    pass

def finalizer(ref):  # the signal is handled in here, as it was inside the database driver's weakref callbacks
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    sum(range(1000))

try:
    with terminating():
        thing = Thing()
        ref = weakref.ref(thing, finalizer)
        del thing
        while True:
            sum(range(1000))
except BaseException as e:
    print(exit_code(e))
"""


@pytest.mark.parametrize("signal_name,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_stop_raised_inside_a_finalizer_still_stops(signal_name, code):
    """Python prints and drops an exception raised inside a finalizer: a stop that lands there is raised again in
    ordinary code, and nothing is printed but the stop."""
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, signal_name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG,  # a hang guard: without the re-raise the loop never ends
        preexec_fn=default_sigint,
    )
    assert (proc.stdout.strip(), proc.stderr) == (str(code), "")


def _wait_for_handlers() -> None:
    for _ in range(1000):  # a handler runs between bytecodes
        time.sleep(0.001)


def test_a_sigterm_before_lightning_installs_its_handler_stops_at_once():
    """Between entering fit and Lightning installing its own SIGTERM handler (DDP: seconds, while the other ranks
    start) a SIGTERM stops with 143, as outside Lightning's loops; once Lightning's handler is installed, it alone
    acts (it calls this one too)."""
    from harness.signals import Stopped, lightning_owns_sigterm, terminating

    with pytest.raises(Stopped) as stop, terminating(), lightning_owns_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_handlers()
    assert stop.value.code == 143

    seen: list[int] = []
    with terminating(), lightning_owns_sigterm():
        ours = signal.getsignal(signal.SIGTERM)
        assert callable(ours)
        signal.signal(signal.SIGTERM, lambda signum, frame: (seen.append(signum), ours(signum, frame)))  # Lightning's
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_handlers()
        finally:
            signal.signal(signal.SIGTERM, ours)
    assert seen == [signal.SIGTERM]


def test_prepare_stopped_by_sigterm_exits_143_and_leaves_nothing(tmp_path):
    """SIGTERM mid-prepare (a preempted job): exit 143, the partial folder removed (a BPE vocabulary on a stream is
    slow enough to be caught mid-way)."""

    datasets = pytest.importorskip("datasets")
    rows = [f"row {i} " + "word " * (i % 50) for i in range(200_000)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "prepare",
            str(out),
            "data=hf",
            f"data.path={tmp_path / 'ds'}",
            "data.streaming=true",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + HANG
    while not (out / "train-00000.bin").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "prepare ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    assert err.strip() == f"stopped: nothing was left in {out}" and not out.exists()
