"""Faults: a locked sqlite store is retried, and concurrent writers lose no point."""

import pytest


def locked_error():
    """sqlite's own lock error (a second writer while one holds the lock), wrapped as MLflow wraps it: MLflow's
    exception from SQLAlchemy's, from sqlite3's (whose result code, SQLITE_BUSY, is what the retry reads)."""
    import sqlite3
    import tempfile

    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as d:
        holder = sqlite3.connect(f"{d}/s.db", isolation_level=None)
        holder.execute("create table t (x)")
        holder.execute("begin exclusive")
        try:
            sqlite3.connect(f"{d}/s.db", timeout=0).execute("insert into t values (1)")
        except sqlite3.OperationalError as busy:
            try:
                raise RuntimeError("(sqlite3.OperationalError) database is locked") from busy
            except RuntimeError as cause:
                try:
                    raise MlflowException("(sqlite3.OperationalError) database is locked") from cause
                except MlflowException as e:
                    return e
        finally:
            holder.close()
    raise AssertionError("the second writer was not refused")


def test_locked_store_is_retried_with_growing_jittered_waits():
    from harness.record.store import retry_locked

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

    from harness.record.store import retry_locked

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
    from harness.integrity import SealedClient
    from harness.record.store import RetryingClient, Store

    client = Store.open(store).client
    assert isinstance(client, SealedClient) and isinstance(client.raw, RetryingClient)  # seals checked, then retried
    client = client.raw
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


def test_retrying_client_survives_pickling(store):
    """joblib and submitit pickle the sweep callback, which holds the client."""
    import pickle

    from harness.record.store import Store

    uri = store  # a copy of the migrated empty store
    client = pickle.loads(pickle.dumps(Store.open(uri).client))
    assert client.get_experiment_by_name("Default") is not None
    assert client.search_runs(["0"]) == []  # the sealed layer's own methods survive too


def test_a_store_damaged_under_a_run_is_named_by_sqlite_not_taken_as_finished(tmp_path):
    """The store cut to half its size while a run writes (another process truncating it): sqlite's own result code
    under MLflow's exception (SQLITE_CORRUPT), or, where sqlite wrote on without noticing, the check when the run
    closes, gives the one line naming the store; the run is never reported finished (exit 0) into a store that no
    longer opens."""
    import os

    from harness.errors import StoreDamaged, damaged_store_line, store_damage
    from harness.record.run import TrackedRun

    db = tmp_path / "mlflow.db"
    run = TrackedRun(f"sqlite:///{db}", "posbench", "damaged")
    with pytest.raises(Exception) as raised:
        with run.open({}, {"a": "1"}):
            run.log_scalars({f"m{i}": float(i) for i in range(200)}, 1)
            os.truncate(db, db.stat().st_size // 2)
            run.log_scalars({f"m{i}": float(i) for i in range(200)}, 2)
    e = raised.value
    line = str(e) if isinstance(e, StoreDamaged) else damaged_store_line(str(db), store_damage(e) or "")
    assert line.startswith(f"error: the tracking store {db} was damaged while the run wrote to it (")
    assert isinstance(e, StoreDamaged) or "malformed" in line or "not a database" in line, line
    assert "run the same command again with a new logger.tracking_uri" in line


def test_the_check_of_a_closed_run_keeps_other_writers_out_until_it_has_read(tmp_path, monkeypatch):
    """The check when a run closes reads the store's header and runs sqlite's quick check under a shared lock, so
    another cell's writer cannot commit mid-check. Opening and closing the file by other means than sqlite drops
    every POSIX lock this process holds on it: a writer then committed mid-check, and a sweep stopped at a store
    it called damaged ("database disk image is malformed") that was whole."""
    import sqlite3
    import subprocess
    import sys

    from harness.record import store

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    writer = (
        "import sqlite3, sys\n"
        "try:\n"
        "    sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None).execute('begin exclusive')\n"
        "    print('committed')\n"
        "except sqlite3.OperationalError as e:\n"
        "    print(e)\n"
    )
    seen = []
    real = store.damage_of

    def damage_then_a_writer(*args):
        why = real(*args)
        seen.append(subprocess.run([sys.executable, "-c", writer, str(db)], capture_output=True, text=True).stdout)
        return why

    monkeypatch.setattr(store, "damage_of", damage_then_a_writer)
    store.check_whole(f"sqlite:///{db}")
    assert seen == ["database is locked\n"]
