"""Several processes opening one brand-new sqlite store at once: MLflow's own migration races
there (most of the processes can fail); harness.record.store.Store.open makes them take turns."""

import multiprocessing as mp


def _open_store(uri: str) -> None:
    from harness.record.store import Store

    Store.open(uri).experiment_id("race")


def test_concurrent_first_open_of_a_new_store(tmp_path):
    ctx = mp.get_context("spawn")
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    procs = [ctx.Process(target=_open_store, args=(uri,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_experiment_by_name("race") is not None
