"""A committed checkpoint carries the sha256 of its bytes as written; resume refuses one whose bytes changed
since, in one line naming the fix, and reads one from before digests as it is."""

from __future__ import annotations

import types

import pytest
import torch

from harness.errors import ConfigError
from harness.integrity import seal_path
from harness.record.callbacks import CommittedCheckpoints
from harness.record.resume import checkpoint_step, latest_checkpoint, remove_checkpoints


class Trainer:
    """What CommittedCheckpoints reads of Lightning's trainer: the step, the rank, save_checkpoint."""

    is_global_zero = True

    def __init__(self):
        self.global_step = 0

    def save_checkpoint(self, path):
        torch.save({"global_step": self.global_step, "weights": torch.arange(20_000.0)}, path)


def _commit_steps(directory, *steps: int) -> None:
    cb, trainer = CommittedCheckpoints(directory, every=2, flush=lambda: None), Trainer()
    for step in steps:
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)  # saved as pending, with its digest
        cb.on_train_batch_start(trainer, None, None, 0)  # committed at the next step's start


def _flip(path, n: int = 400) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + n] = bytes(b ^ 0xFF for b in data[middle : middle + n])
    path.write_bytes(bytes(data))


def test_a_committed_checkpoint_has_its_digest_and_the_older_ones_go(tmp_path):
    _commit_steps(tmp_path, 2, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4.ckpt", "step-4.ckpt.sha256"]
    assert checkpoint_step(latest_checkpoint(tmp_path)) == 4
    remove_checkpoints(tmp_path)
    assert not list(tmp_path.iterdir())


def test_flipped_bytes_are_refused_at_resume_though_torch_still_loads_them(tmp_path):
    _commit_steps(tmp_path, 2)
    ckpt = latest_checkpoint(tmp_path)
    _flip(ckpt)
    assert torch.load(ckpt, weights_only=False)["global_step"] == 2  # what was resumed before: damage unseen
    with pytest.raises(ConfigError) as e:
        checkpoint_step(ckpt)
    assert str(e.value).startswith(f"{ckpt} is damaged (its sha256 ")
    assert str(e.value).endswith("delete it and its .sha256 to resume from an earlier checkpoint, or drop resume=")


def test_a_checkpoint_from_before_digests_is_read_as_it_is(tmp_path):
    _commit_steps(tmp_path, 2)
    ckpt = latest_checkpoint(tmp_path)
    seal_path(ckpt).unlink()
    assert checkpoint_step(ckpt) == 2


def test_the_resume_path_checks_the_digest(tmp_path, monkeypatch):
    """resume=PATH: the refusal comes before the link file is read."""
    from harness.record import resume

    _commit_steps(tmp_path, 2)
    ckpt = latest_checkpoint(tmp_path)
    _flip(ckpt)
    with pytest.raises(ConfigError, match="is damaged"):
        resume._checkpoint_and_link(ckpt, types.SimpleNamespace(dir=tmp_path, config_hash="h"))


# ---------------------------------------------------------------- run records sealed


@pytest.mark.parametrize("damage", ["flip", "truncate", "edit", "not-an-object"])
def test_a_damaged_run_record_is_one_line_naming_it(tmp_path, damage):
    """run.json (the run a config's checkpoints belong to) and mlflow_sweep.json (the parent a sweep's jobs attach
    to) carry their own sha256: a flipped byte, a truncation or an edit is one line naming the file and the fix,
    not a JSONDecodeError or TypeError traceback, and never a record silently pointing elsewhere."""
    import json

    from harness.errors import ConfigError
    from harness.record.resume import LINK, RunLink
    from harness.sweep.callback import RECORD, SweepRecord

    RunLink("r1", "h", "sqlite:///x.db", "e").save(tmp_path)
    SweepRecord("p1", "s1", "sqlite:///x.db", "e", ["pos"]).save(tmp_path)
    assert RunLink.load(tmp_path) == RunLink("r1", "h", "sqlite:///x.db", "e")
    assert SweepRecord.load(tmp_path).swept_keys == ["pos"]
    for name, load in ((LINK, lambda: RunLink.load(tmp_path)), (RECORD, lambda: SweepRecord.load(tmp_path))):
        path = tmp_path / name
        text = path.read_text()
        if damage == "flip":
            path.write_text(text.replace("sqlite:///x.db", "sqlite:///y.db"))  # valid JSON, another store
        elif damage == "truncate":
            path.write_text(text[: len(text) // 2])
        elif damage == "edit":
            record = json.loads(text)
            record.pop("sha256")
            record.pop("experiment")  # an edit that also drops the seal: the fields are still checked
            path.write_text(json.dumps(record))
        else:
            path.write_text("[1, 2]")
        with pytest.raises(ConfigError) as e:
            load()
        said = str(e.value)
        assert said.startswith(f"{path} is damaged (") and "\n" not in said
        assert ("delete" in said) if name == LINK else ("hydra.sweep.dir" in said)


@pytest.mark.parametrize(
    "every, start, stop", [(2, 4, KeyboardInterrupt()), (0, 0, SystemExit(143)), (0, 4, SystemExit(143))]
)
def test_a_stopped_run_names_the_checkpoint_there_is(tmp_path, every, start, stop):
    """Stopped in step 5 of a run resumed from ``start`` (0: a new run): Ctrl-C there saves nothing and the next
    checkpoint every 2 steps is 6's, so ``start``'s is the one to resume; with checkpoints off (every 0) a SIGTERM
    saves none either. The stopped run's line reads the step from STOPPED_AT (0: none, so no resume=true)."""
    from harness.signals import STOPPED_AT

    STOPPED_AT.clear()
    cb = CommittedCheckpoints(tmp_path, every, lambda: None, start)
    trainer = Trainer()
    trainer.validating = False
    trainer.global_step = 4
    cb.on_train_batch_start(trainer, None, None, 0)
    trainer.global_step = 5
    cb.on_train_batch_end(trainer, None, None, None, 0)
    cb.on_exception(trainer, None, stop)
    assert STOPPED_AT.pop("step") == start and not list(tmp_path.iterdir())


def test_a_checkpoint_dropped_by_a_stop_in_validation_leaves_no_file(tmp_path):
    """Step 4 saved as pending, then stopped inside step 4's validation: that checkpoint is never committed, so
    its file and digest go at once; step 2's stays the one to resume."""
    from harness.signals import STOPPED_AT

    cb = CommittedCheckpoints(tmp_path, 2, lambda: None)
    trainer = Trainer()
    for step in (2, 4):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, None, None, 0)  # commits the step before's
        cb.on_train_batch_end(trainer, None, None, None, 0)
    assert (tmp_path / "pending.ckpt").is_file()
    trainer.validating, trainer.state = True, types.SimpleNamespace(fn="fit")
    cb.on_exception(trainer, None, SystemExit(143))
    assert STOPPED_AT.pop("step") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2.ckpt", "step-2.ckpt.sha256"]


class OtherRank(Trainer):
    """A DDP rank other than 0: Lightning writes checkpoints on global rank 0 only."""

    is_global_zero = False
    validating = False
    state = types.SimpleNamespace(fn="fit")

    def save_checkpoint(self, path):
        pass


def test_every_rank_names_the_step_a_stop_left_to_resume(tmp_path, monkeypatch):
    """DDP: rank 0 writes and commits the checkpoints, and every rank's stop line (harness/cli.py) names the step
    they hold, not "no checkpoint was written yet"; the other ranks write nothing."""
    from harness.signals import STOPPED_AT

    monkeypatch.setitem(STOPPED_AT, "step", -1)
    cb, trainer = CommittedCheckpoints(tmp_path, every=2, flush=lambda: None), OtherRank()
    for step in (1, 2, 3):
        cb.on_train_batch_start(trainer, None, None, 0)
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)
    cb.on_exception(trainer, None, SystemExit())  # SIGTERM after step 3: the step is saved and committed
    assert STOPPED_AT["step"] == 3
    assert not list(tmp_path.iterdir())
