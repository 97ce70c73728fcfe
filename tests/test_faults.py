"""Faults: a locked sqlite store is retried, and concurrent writers lose no point."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, TINY


def locked_error():
    from mlflow.exceptions import MlflowException

    try:  # MLflow wraps SQLAlchemy's OperationalError, which wraps sqlite3's
        raise RuntimeError("(sqlite3.OperationalError) database is locked")
    except RuntimeError as cause:
        try:
            raise MlflowException("(sqlite3.OperationalError) database is locked") from cause
        except MlflowException as e:
            return e


def test_locked_store_is_retried_with_growing_jittered_waits():
    from harness.record.retry import retry_locked

    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise locked_error()
        return "written"

    assert retry_locked(flaky, sleep=waits.append)() == "written"
    assert len(calls) == 4 and len(waits) == 3
    assert all(0 <= w <= 0.05 * 2**i for i, w in enumerate(waits))  # exponential cap, full jitter


def test_retries_are_bounded_and_other_errors_are_not_retried():
    from mlflow.exceptions import MlflowException

    from harness.record.retry import retry_locked

    calls = []

    def always_locked():
        calls.append(1)
        raise locked_error()

    with pytest.raises(MlflowException, match="database is locked"):
        retry_locked(always_locked, attempts=5, sleep=lambda s: None)()
    assert len(calls) == 5

    def bad_request():
        calls.append(1)
        raise ValueError("invalid metric name")

    calls.clear()
    with pytest.raises(ValueError):
        retry_locked(bad_request, sleep=lambda s: None)()
    assert len(calls) == 1


def test_client_methods_are_wrapped(store, monkeypatch):
    from harness.record.retry import RetryingClient
    from harness.record.store import Store

    client = Store.open(store).client
    assert isinstance(client, RetryingClient)
    # a call goes through to this store: a fresh one holds MLflow's Default experiment, id 0
    assert [(e.experiment_id, e.name) for e in client.search_experiments()] == [("0", "Default")]
    inner, calls = client._client, []
    answer = inner.search_experiments

    def locked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise locked_error()
        return answer(*args, **kwargs)

    monkeypatch.setattr(inner, "search_experiments", locked_once)
    assert [e.name for e in client.search_experiments()] == ["Default"] and len(calls) == 2  # retried once


WRITER = """
import sys, time
from mlflow.entities import Metric
from harness.record.store import Store
uri, tag, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store.open(uri)
client = store.client
run_id = client.create_run(store.experiment_id("posbench"), run_name=tag, tags={"writer": tag}).info.run_id
for b in range(batches):  # small batches: as many write transactions as possible
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric("train/loss", float(b * 10 + i), now, b * 10 + i) for i in range(10)])
    client.set_tag(run_id, "progress", str(b))
client.set_terminated(run_id, "FINISHED")
"""


@pytest.mark.slow
def test_two_writers_hammering_one_store_lose_nothing(store):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store, name, "60"], env=env, cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert sorted(r.data.tags["writer"] for r in runs) == ["a", "b"]
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["progress"] == "59"
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
        assert steps == list(range(600))
    print(f"retries on a locked store: {sum(e.count('mlflow store locked') for e in errors)}")


@pytest.mark.slow
def test_two_run_py_jobs_at_once_log_every_point(store, tmp_path):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "run.py"), *TINY, f"seed={seed}",
                               f"hydra.run.dir={tmp_path}/run{seed}"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for seed in (0, 1)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(1, 7))
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss")) == [3, 6]
        assert len(run.data.params) > 50  # the whole flattened config


def test_retrying_client_survives_pickling(tmp_path):
    """joblib and submitit pickle the sweep callback, which holds the client."""
    import pickle

    from harness.record.store import Store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = pickle.loads(pickle.dumps(Store.open(uri).client))
    assert client.get_experiment_by_name("Default") is not None
