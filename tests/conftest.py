"""Fixtures: fresh MLflow stores, tiny models trained into them, one shared sweep. The helpers they
use (and the tests import) live in tests/helpers.py: import them from there, never from here."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

# Test tensors are tiny: a second intra-op thread only adds synchronisation, and on a busy 2-core
# machine OpenMP's spin-waiting makes small fp64 kernels many times slower. One thread here, and in every
# process a test starts (they inherit the environment).
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"

# tests/ is no package: `tests.helpers` and `tests.attn_cases` import from the checkout's root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import SweepResult, run_sweep, tiny_trainer  # noqa: E402


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory) -> Path:
    """An MLflow sqlite store with its schema migrated, made once: migrating is slow, copying is not."""
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


@pytest.fixture
def train_tiny(store):
    """train_tiny(*overrides) -> (Summary, MlflowClient): a few steps, read back from MLflow."""
    return tiny_trainer(store)


@pytest.fixture(scope="module")
def train_tiny_shared(tmp_path_factory, _empty_store):
    """train_tiny with one store for the whole test module (a copy of the empty store: migrating one costs
    seconds, which a grid of many tiny runs, or a session of such modules, should pay once). Runs are told apart
    by id."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(_empty_store, db)
    uri = f"sqlite:///{db}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield tiny_trainer(uri)


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, _empty_store) -> SweepResult:
    """One 2-cell sweep shared by the sweep, report and dashboard tests (made once: it trains two cells):
    pos=rope,learned with eval.lengths=[16,64] (learned's table holds data.seq_len=32), into a copy of the empty
    store."""
    folder = tmp_path_factory.mktemp("tiny_sweep")
    shutil.copyfile(_empty_store, folder / "mlflow.db")
    return run_sweep(folder, "pos=rope,learned", "eval.lengths=[16,64]")
