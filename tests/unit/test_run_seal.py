"""A closed run's record is sealed (harness/integrity.py): a changed value in the store — a flipped bit in a
metric, an edited param, tag or status, a damaged seal — is refused in one line when the run is read back, and an
unchanged record, an unsealed one and a tag added later read as they are."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.integrity import MARK_TAG, SEAL_TAG, RecordDamaged, SealedClient, seal

# each test's tmp_path holds a copy of conftest's migrated empty store (mlflow.db): _store writes into it
pytestmark = pytest.mark.usefixtures("store")

LOSS = 1.2345678901234567  # a value whose eight bytes occur nowhere else in the file


def _store(tmp_path: Path, n_metrics: int = 0) -> tuple[Path, str, MlflowClient]:
    db = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    run_id = client.create_run(
        client.create_experiment("posbench"),
        run_name="pos=rope attn=softmax seed=0",
        tags={"pos": "rope", "attn": "softmax", MARK_TAG: "1"},
    ).info.run_id  # as TrackedRun
    client.log_batch(
        run_id,
        params=[Param("data.seq_len", "128"), Param("model.n_params", "1000")],
        metrics=[
            Metric("val/loss", LOSS - 1, 0, 1),
            Metric("val/loss", LOSS, 1, 2),
            *(Metric(f"val/acc_at_{i}", 0.5, 1, 2) for i in range(n_metrics)),
        ],
    )
    client.set_terminated(run_id, "FINISHED")
    seal(client, run_id)
    return db, run_id, client


def _read(db: Path, run_id: str) -> None:
    client = SealedClient(MlflowClient(f"sqlite:///{db}"))
    client.get_run(run_id)
    client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    for key in client.get_run(run_id).data.metrics:
        client.get_metric_history(run_id, key)


def _sql(db: Path, statement: str) -> None:
    with sqlite3.connect(db) as conn:
        assert conn.execute(statement).rowcount == 1


def test_a_sealed_record_reads_back_and_so_does_a_tag_added_later(tmp_path):
    db, run_id, client = _store(tmp_path)
    _read(db, run_id)
    client.set_tag(run_id, "reviewed", "yes")  # a tag the seal does not list
    client.set_tag(run_id, "mlflow.runName", "renamed in the dashboard")
    _read(db, run_id)


def test_a_run_from_before_seals_reads_as_it_is(tmp_path):
    db, run_id, client = _store(tmp_path)
    client.delete_tag(run_id, SEAL_TAG)
    client.delete_tag(run_id, MARK_TAG)  # created by a posbench that did not seal
    _sql(db, "UPDATE params SET value = '129' WHERE key = 'data.seq_len'")
    _read(db, run_id)


def _flip_bit_of_loss(db: Path) -> None:
    """The last bit of the stored loss, wherever the file holds it (its row in ``metrics`` and ``latest_metrics``
    and the metrics' index, which holds the value too: sqlite then reads the flipped value back, consistently)."""
    data, value = bytearray(db.read_bytes()), struct.pack(">d", LOSS)  # sqlite stores a REAL as 8 big-endian bytes
    at = [i for i in range(len(data)) if data.startswith(value, i)]
    assert at
    for i in at:
        data[i + 7] ^= 0x01
    db.write_bytes(bytes(data))


DAMAGE = [
    ("one bit of a metric", _flip_bit_of_loss, "a metric's latest value"),
    ("a param", lambda db: _sql(db, "UPDATE params SET value = '129' WHERE key = 'data.seq_len'"), "a param"),
    ("a tag", lambda db: _sql(db, "UPDATE tags SET value = 'alibi' WHERE key = 'pos'"), "a tag differs"),
    ("a tag deleted", lambda db: _sql(db, "DELETE FROM tags WHERE key = 'attn'"), "tag 'attn' is gone"),
    ("the status", lambda db: _sql(db, "UPDATE runs SET status = 'FAILED'"), "its status"),
    (
        "the latest value",
        lambda db: _sql(db, "UPDATE latest_metrics SET value = 0.5 WHERE key = 'val/loss'"),
        "a metric's latest value",
    ),
    (
        "a history point",
        lambda db: _sql(db, "UPDATE metrics SET value = 9 WHERE key = 'val/loss' AND step = 1"),
        "metric 'val/loss''s history",
    ),
    (
        "the seal",
        lambda db: _sql(db, f"UPDATE tags SET value = substr(value, 2) WHERE key = '{SEAL_TAG}'"),
        "its seal is unreadable",
    ),
    ("the seal deleted", lambda db: _sql(db, f"DELETE FROM tags WHERE key = '{SEAL_TAG}'"), "its seal is gone"),
    (
        "the seal's key",
        lambda db: _sql(db, f"UPDATE tags SET key = 'posbench.sea1' WHERE key = '{SEAL_TAG}'"),
        "its seal's key reads 'posbench.sea1'",
    ),
]


@pytest.mark.parametrize("damage, needle", [(d, n) for _, d, n in DAMAGE], ids=[i for i, _, _ in DAMAGE])
def test_a_changed_record_is_refused_in_one_line_naming_the_run(tmp_path, damage, needle):
    db, run_id, _ = _store(tmp_path)
    damage(db)
    with pytest.raises(RecordDamaged) as refused:
        _read(db, run_id)
    line = str(refused.value)
    assert needle in line and run_id in line and "pos=rope attn=softmax seed=0" in line and "\n" not in line
    assert line.endswith("restore the store from a copy, or delete that run in the dashboard and run its command again")


def test_more_metrics_than_a_tag_holds_digests_of_are_sealed_together(tmp_path):
    db, run_id, client = _store(tmp_path, n_metrics=250)  # past MAX_SEAL_CHARS at a digest each
    text = client.get_run(run_id).data.tags[SEAL_TAG]
    assert len(text) < 8000  # MLflow's limit on a tag value
    assert isinstance(json.loads(text)["history"], str)  # the histories sealed together: one digest over all
    _read(db, run_id)
    _sql(db, "UPDATE metrics SET value = 0.25 WHERE key = 'val/acc_at_7'")
    with pytest.raises(RecordDamaged, match="history differs"):
        SealedClient(MlflowClient(f"sqlite:///{db}")).get_metric_history(run_id, "val/loss")


def test_a_trained_run_is_sealed_when_it_closes_and_reopened_without_its_seal(tmp_path):
    from harness.record.run import TrackedRun
    from harness.record.store import Store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = TrackedRun(uri, "posbench", "pos=rope attn=softmax seed=0")
    with run.open({"pos": "rope"}, {"data.seq_len": "128"}):
        run.log_scalars({"val/loss": 2.0}, 1)
    client = Store.open(uri).client
    assert {SEAL_TAG, MARK_TAG} <= set(client.get_run(run.run_id).data.tags)  # marked at creation, sealed at close
    again = TrackedRun(uri, "posbench", "pos=rope attn=softmax seed=0")
    again.start({"pos": "rope"}, {}, reopen=run.run_id)
    assert SEAL_TAG not in client.get_run(run.run_id).data.tags  # written again: sealed when it closes
    again.log_scalars({"val/loss": 1.5}, 2)
    again.end("FINISHED")
    client.get_metric_history(run.run_id, "val/loss")  # checked against the new seal


@pytest.mark.parametrize("mode", ["require", "auto"])
def test_resuming_a_damaged_record_is_refused_or_started_anew(tmp_path, monkeypatch, capsys, mode):
    """resume=true on a run whose record changed since it closed: its one line; resume=auto (a sweep's cells): one
    warning, and the run starts anew (nothing is resumed into a damaged record)."""
    from harness.record import resume
    from harness.record.resume import RunLink
    from tests.helpers import spec

    db, run_id, client = _store(tmp_path)
    client.set_terminated(run_id, "KILLED")  # resumable, then sealed as it closed
    seal(client, run_id)
    _sql(db, "UPDATE params SET value = '129' WHERE key = 'data.seq_len'")
    uri = f"sqlite:///{db}"
    values = spec(f"logger.tracking_uri={uri}", f"checkpoint.dir={tmp_path / 'ckpt'}").values
    link = RunLink(run_id, resume.config_hash(values, uri), uri, "posbench")
    monkeypatch.setattr(resume, "_checkpoint_and_link", lambda *_: (tmp_path / "step-4.ckpt", link))
    if mode == "require":
        with pytest.raises(RecordDamaged, match=f"run {run_id} .* is damaged: a param differs"):
            resume.plan_resume(values, uri, mode)
    else:
        assert resume.plan_resume(values, uri, mode).run_id is None
        assert f"warning: run {run_id}" in capsys.readouterr().err
