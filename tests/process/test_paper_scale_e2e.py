"""paper_scale: the end-to-end tests, each training (the rest: tests/unit/test_paper_scale.py).

The scale=paper presets (conf/experiment/*/scale/paper.yaml, enumerated): each passes ``--check`` for a GPU of
a named size (80 GB by default) with its memory estimate; the estimate against a hand computation and, in
fp32, against the meta rehearsal of the real model; and three optimizer steps of each preset on this CPU with
its model and batch shrunk (2 sequences; 32 where the final scoring would be thousands of batches of 2) but its
corpus, sequence length, tokenizer, objective and precision as the preset has them.
"""

from __future__ import annotations

import pytest
import torch

from tests import inprocess
from tests.helpers import HANG, ROOT
from tests.paper_presets import PAPER, _composed, _first_cell

SHRUNK = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64"]
# sequences a batch: 2, but randomized_positions scores its final model on 512 examples at each of 4 lengths, for the
# mixture and each of its 4 parts, in batches of data.batch_size: ~6,000 forward passes of 2, ~400 of 32 (a quarter
# of the preset's 128)
BATCH = {"randomized_positions": 32}

ON_CPU = [
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "optim.schedule.warmup_steps=1",
    "data.eval_batches=1",
    "checkpoint.every_n_steps=0",
]

# the final evaluation kept cheap: sliding windows every 64 tokens at 8× the length are minutes of a CPU, and a
# fine-tune of 400 steps per scaling would be 2000 steps; one step of each shows the path runs
CHEAP_EVAL = {"alibi_extrapolation": ["eval.stride=null"], "rope_scaling": ["eval.finetune_steps=1"]}


@pytest.mark.parametrize("preset", PAPER)
def test_three_optimizer_steps_of_every_paper_preset_on_the_cpu(preset, store):
    from harness.train import train

    cell, checked = _first_cell(preset)
    batch = BATCH.get(preset, 2)
    shrunk = [*SHRUNK, f"data.batch_size={batch}"]
    spec = _composed([f"experiment={preset}", "scale=paper", *cell, *shrunk, *ON_CPU, *CHEAP_EVAL.get(preset, [])])
    paper = checked.spec
    assert spec.values["task"] == paper.values["task"] and spec.values["tokenizer"] == paper.values["tokenizer"]
    # the corpus and seq_len as the preset's
    assert spec.values["data"] == {**paper.values["data"], "batch_size": batch, "eval_batches": 1}
    assert spec.trainer.precision == paper.trainer.precision  # bf16-mixed runs as CPU autocast here
    summary = train(spec)
    assert summary.step == 3
    assert summary.val_loss is not None and torch.isfinite(torch.tensor(summary.val_loss))


def test_the_eleuther_rotary_paper_pipeline_rehearsed_end_to_end_on_the_cpu(store, tmp_path, monkeypatch):
    """What a researcher runs before paying for a GPU, at the paper's depth (12 layers) and vocabulary (GPT-2's
    50,257) at width 32: local train/validation parquet files -> a BPE vocabulary trained on them -> shards ->
    `-m experiment=eleuther_rotary scale=paper data=tokens` (learned, T5, rotary) -> `results paper`. A broken paper
    path fails here, not on a GPU allocation. This corpus is too small for 50,257 ids: the vocabulary trains the ids it
    allows, the manifest and each run record how many, and the run says it trains a substitute on purpose (~paper)."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    from harness.data import corpus
    from harness.data.corpus import Embedded
    from harness.main import prepare_shards as prepare

    docs = [d for d in Embedded().load().train.decode("utf-8", errors="replace").split("\n\n") if d.strip()]
    (tmp_path / "owt").mkdir()
    datasets.Dataset.from_dict({"text": docs[:1500]}).to_parquet(str(tmp_path / "owt" / "train.parquet"))
    datasets.Dataset.from_dict({"text": docs[-150:]}).to_parquet(str(tmp_path / "owt" / "validation.parquet"))
    vocab = ["tokenizer=bpe", "tokenizer.vocab_size=50257"]
    manifest = prepare(
        tmp_path / "shards", ["data=hf", f"data.path={tmp_path / 'owt'}", "data.val_split=validation", *vocab]
    )
    trained = manifest["tokenizer"]["vocab_size"]
    assert manifest["tokenizer"]["recipe"]["vocab_size"] == 50257 and 300 < trained < 50257
    assert manifest["splits"]["val"]["tokens"] > 0
    # the commands run in this interpreter (tests/inprocess.py): the test reads what they wrote, not how a process
    # ends, and a fresh interpreter per command would import Lightning and MLflow again; the cache dir as a fresh
    # process given POSBENCH_CACHE would have it (the module reads that variable at import)
    monkeypatch.setattr(corpus, "CACHE", tmp_path / "cache")
    env = {"MLFLOW_TRACKING_URI": store, "POSBENCH_CACHE": str(tmp_path / "cache")}
    small = [
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "data.seq_len=64",
        "data.batch_size=1",
        "data.eval_batches=1",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "trainer.enable_progress_bar=false",
        "seed=0",
    ]
    sweep = inprocess.run(
        "run",
        [
            "-m",
            "experiment=eleuther_rotary",
            "scale=paper",
            "data=tokens",
            f"data.path={tmp_path / 'shards'}",
            *vocab,
            *small,
            "~paper",
            f"hydra.sweep.dir={tmp_path / 'multirun'}",
        ],
        str(ROOT),
        env,
        HANG,
    )
    assert sweep["code"] == 0, sweep["stderr"][-2000:]
    argv = ["paper", "--preset", "eleuther_rotary", "--scale", "paper", "--out", str(tmp_path / "report")]
    report = inprocess.run("results", argv, str(ROOT), env, HANG)
    assert report["code"] == 0, report["stderr"][-2000:]
    text = (tmp_path / "report" / "README.md").read_text()
    assert text.startswith("# eleuther_rotary (paper scale)") and "**Verdict:" in text
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("paper-eleuther_rotary").experiment_id])
    cells = {r.data.tags["pos"]: r for r in runs if r.data.tags.get("sweep_role") != "parent"}
    assert sorted(cells) == ["learned", "rope", "t5"]
    for run in cells.values():
        assert run.info.status == "FINISHED" and run.data.params["model.n_layers"] == "12"
        assert (
            run.data.params["tokenizer.vocab_size"] == "50257"
            and run.data.params["data.path"] == str(tmp_path / "shards")
            and run.data.params["tokenizer.trained_vocab_size"] == str(trained)
        )
