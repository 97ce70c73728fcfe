"""faults: the tests that start real processes (the rest: tests/unit/test_faults.py).

Faults: a locked sqlite store is retried, and concurrent writers lose no point.
"""

import os
import subprocess
import sys

from tests.helpers import HANG, ROOT, TINY

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


def test_two_writers_hammering_one_store_lose_nothing(store):
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, store, name, "60"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    errors = [p.communicate(timeout=HANG)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert sorted(r.data.tags["writer"] for r in runs) == ["a", "b"]
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["progress"] == "59"
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
        assert steps == list(range(600))
    print(f"retries on a locked store: {sum(e.count('mlflow store locked') for e in errors)}")


def test_two_run_py_jobs_at_once_log_every_point(store, tmp_path):
    from mlflow.tracking import MlflowClient

    # one thread each: two jobs on a small machine, each with a spin-waiting OpenMP pool, only burn CPU
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), *TINY, f"seed={seed}", f"hydra.run.dir={tmp_path}/run{seed}"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    ]
    errors = [p.communicate(timeout=HANG)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(1, 7))
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss")) == [3, 6]
        assert len(run.data.params) > 50  # the whole flattened config
