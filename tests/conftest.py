"""Shared fixtures: compose the real Hydra config, train tiny models into a temporary store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# Test tensors are tiny: a second intra-op thread only adds synchronisation, and on a busy 2-core
# machine OpenMP's spin-waiting made small fp64 kernels ~50x slower (measured).
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Tiny but real: every end-to-end test trains through the same code path as run.py.
TINY = [
    "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
    "data.seq_len=32", "data.batch_size=8", "data.eval_batches=2",
    "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false", "optim.schedule.warmup_steps=2",
]


def compose(overrides: list[str] = ()):
    """The composed config, hydra node included (tests read hydra.runtime.choices)."""
    from harness.config.compose import compose as harness_compose

    return harness_compose(overrides, hydra=True)

def choices_of(cfg) -> dict[str, str]:
    return {g: cfg.hydra.runtime.choices[g] for g in ("pos", "attn", "task", "data")}


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its schema migrated, made once: migrating costs ~2 s a store."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(tmp_path, monkeypatch, _empty_store):
    """A fresh sqlite tracking URI (a copy of the empty store); MLFLOW_TRACKING_URI points at it too."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _tiny_trainer(uri: str):
    from mlflow.tracking import MlflowClient
    from omegaconf import open_dict

    from harness.train import train

    def run(*overrides: str):
        cfg = compose([*TINY, *overrides])
        choices = choices_of(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        return train(cfg, choices), MlflowClient(tracking_uri=uri)

    return run


@pytest.fixture
def train_tiny(store):
    """train_tiny(*overrides) -> (Summary, MlflowClient): a few steps, read back from MLflow."""
    return _tiny_trainer(store)


@pytest.fixture(scope="module")
def train_tiny_shared(tmp_path_factory):
    """train_tiny with one store for the whole test module: creating a sqlite store costs seconds of
    schema migrations, which a grid of many tiny runs should pay once. Runs are told apart by id."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield _tiny_trainer(uri)


@dataclass
class SweepResult:
    """A `python run.py -m ...` subprocess run into its own store, read back from MLflow."""

    uri: str
    sweep_dir: Path
    proc: subprocess.CompletedProcess
    client: object  # MlflowClient
    parent: object | None  # mlflow Run
    children: list

    def child(self, pos: str):
        return next(r for r in self.children if r.data.tags["pos"] == pos)


def run_sweep(tmp: Path, *overrides: str) -> SweepResult:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    sweep_dir = tmp / "multirun"
    proc = subprocess.run([sys.executable, "run.py", "-m", *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"],
                          cwd=ROOT, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, capture_output=True,
                          text=True, timeout=300)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("posbench")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    parent = next((r for r in runs if r.data.tags.get("sweep_role") == "parent"), None)
    children = [r for r in runs if r is not parent]
    return SweepResult(uri, sweep_dir, proc, client, parent, children)


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> SweepResult:
    """One 2-cell sweep shared by the sweep, report and dashboard tests (~15 s):
    pos=rope,learned with eval.lengths=[16,64] (learned's table holds data.seq_len=32)."""
    return run_sweep(tmp_path_factory.mktemp("tiny_sweep"), "pos=rope,learned", "eval.lengths=[16,64]")
