"""documents: the tests that train end to end (the rest: tests/unit/test_documents.py).

Packed documents: positions that restart at each document (model.restart_positions) and no
attention across documents (model.document_mask), for every scheme, from the data sources that know where their
documents start to the model, read back from MLflow.
"""

from __future__ import annotations

import numpy as np
import pytest

DOCS = ["model.restart_positions=true", "model.document_mask=true"]


def test_a_packed_document_run_trains_on_its_documents_and_logs_it(train_tiny):
    """CLM on the embedded corpus with both options: the run finishes, says so in its params, scores the order
    check, and its losses differ from the same run reading windows whole (the documents reached the model)."""
    plain, client = train_tiny("task=clm", "model.dropout=0")
    docs, _ = train_tiny("task=clm", "model.dropout=0", *DOCS, "eval.lengths=[16,64]")
    run = client.get_run(docs.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["model.restart_positions"] == "True" and run.data.params["model.document_mask"] == "True"
    assert np.isfinite(run.data.metrics["val/order_gain"]) and "val/loss_at_64" in run.data.metrics
    assert abs(docs.val_loss - plain.val_loss) > 1e-4, (docs.val_loss, plain.val_loss)


def test_a_synthetic_task_is_one_document_an_example_and_trains_as_before(train_tiny):
    """task=reverse with both options: every example is one document, so the run is the plain run number for
    number (positions 0 … T−1, nothing masked)."""
    plain, _ = train_tiny("task=reverse", "model.dropout=0")
    docs, _ = train_tiny("task=reverse", "model.dropout=0", *DOCS)
    assert docs.val_loss == pytest.approx(plain.val_loss, abs=1e-6)
    assert docs.order_gain == pytest.approx(plain.order_gain, abs=1e-6)
