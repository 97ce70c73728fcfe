"""hf_eval: the tests that start real processes (the rest: tests/unit/test_hf_eval.py).

``posbench hf-eval``: a pretrained causal LM under each RoPE scaling × factor, measured as the
PI / NTK / YaRN papers did — perplexity by length with sliding windows, passkey retrieval by depth × length — one
MLflow run per cell under a parent. The whole loop runs offline on a model posbench trained and exported itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers import HANG, tiny_llama
from tests.process.test_signals import default_sigint


def test_train_export_extend_evaluate_offline_read_back_from_mlflow(train_tiny, store, capsys, monkeypatch):
    """Train a tiny modern-block RoPE model, export it (export=hf), then `posbench hf-eval` its folder under none,
    linear and YaRN at 2×: a parent run with a child per cell, each holding loss by length and passkey accuracy."""
    from harness.main import main

    summary, client = train_tiny("model=modern", "task=clm", "export=hf", "trainer.max_steps=6")
    folder = client.download_artifacts(summary.run_id, "hf_model")
    monkeypatch.setattr(
        "sys.argv",
        [
            "posbench",
            "hf-eval",
            folder,
            "--scalings",
            "none,linear,yarn",
            "--factors",
            "2",
            "--lengths",
            "32,128",
            "--budget",
            "256",
            "--passkey-trials",
            "2",
            "--depths",
            "0,1",
            "--tasks",
            "niah_single",
            "--task-trials",
            "2",
            "--tracking-uri",
            store,
        ],
    )
    assert main() == 0
    exp = client.get_experiment_by_name("hf-eval")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kind") == "hf-eval")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted((r.data.tags["scaling"], r.data.tags["factor"]) for r in children) == [
        ("linear", "2"),
        ("none", "1"),
        ("yarn", "2"),
    ]
    for r in [parent, *children]:
        assert r.info.status == "FINISHED"
    none = next(r for r in children if r.data.tags["scaling"] == "none").data.metrics
    linear = next(r for r in children if r.data.tags["scaling"] == "linear").data.metrics
    assert 0 < none["val/loss_at_32"] < 8 and none["val/ppl_at_32"] == pytest.approx(math.exp(none["val/loss_at_32"]))
    assert linear["val/loss_at_32"] != none["val/loss_at_32"]  # the scaling reached the model's rotary module
    assert {"passkey/acc_at_128", "passkey/acc_at_128_depth_0", "passkey/acc_at_128_depth_1"} <= set(none)
    assert "passkey/acc_at_32" not in none  # the needle and question do not fit in 32 bytes: no figure
    assert 0 <= none["ruler/niah_single_at_128"] <= 1 and "ruler/niah_single_at_32" not in none  # nor RULER's
    report = Path(client.download_artifacts(parent.info.run_id, "hf_eval.md")).read_text()
    assert (
        "| none | 1 |" in report and "| yarn | 2 |" in report and "| scaling | factor | niah_single at 128 |" in report
    )
    assert "parent run" in capsys.readouterr().out


def test_hf_eval_with_a_claim_key_tokens_and_a_finetune_read_back_from_mlflow(tmp_path, store):
    """A tiny Llama under none, linear and YaRN at 2×, fine-tuned 3 steps per cell first: each child holds its
    fine-tuning curve, the parent the key-token counts and the claim's verdict; --out has the report; the folder's
    weights are never changed (a plain run after it gives the plain run's loss exactly)."""
    from mlflow.tracking import MlflowClient

    from harness.pretrained.hf_eval import main

    folder = tiny_llama(tmp_path / "tiny")
    common = [
        str(folder),
        "--scalings",
        "none,linear,yarn",
        "--factors",
        "2",
        "--lengths",
        "32,128",
        "--budget",
        "2048",
        "--passkey-trials",
        "0",
        "--key-short",
        "8",
        "--tracking-uri",
        store,
    ]
    assert main([*common, "--claim", "yarn<linear", "--finetune-steps", "3", "--out", str(tmp_path / "out")]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("hf-eval").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kind") == "hf-eval")
    assert parent.data.tags["claim_verdict"] in ("supported", "contradicted", "inconclusive")
    assert {"key/count_at_32", "key/count_at_128"} <= set(parent.data.metrics)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 3
    for child in children:
        assert len(client.get_metric_history(child.info.run_id, "finetune/loss")) == 3
    report = (tmp_path / "out" / "README.md").read_text()
    assert "## Claim: yarn < linear" in report and "| 2 | 128 | yarn − linear |" in report
    assert (tmp_path / "out" / "hf_eval_loss.png").read_bytes()[:4] == b"\x89PNG"
    none_tuned = next(r for r in children if r.data.tags["scaling"] == "none").data.metrics["val/loss_at_32"]
    assert main([*common, "--scalings", "none", "--experiment", "plain"]) == 0
    plain = client.search_runs([client.get_experiment_by_name("plain").experiment_id], "tags.kind = 'hf-eval-cell'")[
        0
    ].data.metrics["val/loss_at_32"]
    assert none_tuned != plain  # the fine-tune reached the none cell's weights …
    assert main([*common, "--scalings", "none", "--experiment", "again"]) == 0
    again = client.search_runs([client.get_experiment_by_name("again").experiment_id], "tags.kind = 'hf-eval-cell'")[
        0
    ].data.metrics["val/loss_at_32"]
    assert again == plain  # … and never the folder's: evaluation alone is deterministic


PROBE = """
import sys, torch, transformers
from harness.pretrained.cost import evaluation_bytes, finetune_bytes
from harness.pretrained.finetune import finetune
from harness.pretrained.measures import token_losses
def peak():  # this address space's high-water mark (ru_maxrss would keep the forking parent's across exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
mode, L, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=V, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=4, intermediate_size=512, max_position_embeddings=L,
                                  attn_implementation="sdpa", use_cache=False)
model = transformers.LlamaForCausalLM(config)
before = peak()  # the weights are in already
ids = torch.randint(0, V, (4 * L,))
if mode == "eval":
    token_losses(model.eval(), ids, L, L, L)
    estimate = sum(evaluation_bytes(config.to_dict(), L, 0).values())  # above the weights
else:
    finetune(model, ids, L, steps=2)
    estimate = sum(finetune_bytes(config.to_dict(), L, 0).values())  # above the weights
print(peak() - before, estimate)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the high-water mark from Linux's /proc")
@pytest.mark.parametrize("mode, length, vocab", [("eval", 2048, 32000), ("finetune", 4096, 8000)])
def test_the_memory_estimate_holds_against_the_measured_peak(mode, length, vocab):
    """cost.py's estimate beside the peak resident memory a fresh process adds above its weights, ±15 %."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(length), str(vocab)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG,
    )
    measured, estimate = map(float, done.stdout.split())
    assert estimate == pytest.approx(measured, rel=0.15), (measured / 2**20, estimate / 2**20)


@pytest.mark.parametrize("family", ["qwen2", "gpt_neox"])
def test_another_family_with_its_own_subword_tokenizer_runs_the_same_command(tmp_path, store, family):
    """A user's model as save_pretrained leaves it — weights, config.json and a tokenizer.json (here a tiny BPE
    trained on the embedded text) — under none and YaRN: finite losses, and YaRN reaches the rotary module."""
    import transformers
    from mlflow.tracking import MlflowClient
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from harness.pretrained.hf_eval import evaluation_text, main

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(
        [evaluation_text("embedded", "train")[:200_000]], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"])
    )
    folder = tmp_path / family
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(folder)
    config = transformers.AutoConfig.for_model(
        family,
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    assert (
        main(
            [
                str(folder),
                "--scalings",
                "none,yarn",
                "--factors",
                "4",
                "--lengths",
                "32,96",
                "--budget",
                "192",
                "--passkey-trials",
                "1",
                "--depths",
                "0.5",
                "--tracking-uri",
                store,
            ]
        )
        == 0
    )
    client = MlflowClient(store)
    cells = {
        r.data.tags["scaling"]: r.data.metrics
        for r in client.search_runs(
            [client.get_experiment_by_name("hf-eval").experiment_id], "tags.kind = 'hf-eval-cell'"
        )
    }
    assert all(math.isfinite(m["val/loss_at_96"]) and m["val/loss_at_96"] > 0 for m in cells.values())
    assert cells["yarn"]["val/loss_at_96"] != cells["none"]["val/loss_at_96"]


@pytest.mark.parametrize("name, number, code", [("SIGTERM", 15, 143), ("Ctrl-C", 2, 130)])
def test_a_stopped_hf_eval_closes_every_run_killed_in_one_line(name, number, code, tmp_path, _empty_store):
    """A preempted job (SIGTERM) or Ctrl-C mid-evaluation: the exit code of the signal, one line saying the runs are
    closed KILLED, and no run left RUNNING in the store."""
    import shutil
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    folder = tiny_llama(tmp_path / "tiny")
    store = tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, store)  # a migrated store: creating one in the process costs seconds
    argv = [
        sys.executable,
        str(ROOT / "run.py"),
        "hf-eval",
        str(folder),
        "--lengths",
        "32,64",
        "--budget",
        "200000",
        "--passkey-trials",
        "0",
        "--key-short",
        "0",  # no LongPPL key tokens: the runs open right after the model loads, the long part comes after
        "--tracking-uri",
        f"sqlite:///{store}",
    ]
    proc = subprocess.Popen(  # SIGINT at its default, as a terminal gives it (tests/process/test_signals.py)
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint
    )

    def running() -> int:
        if not store.exists():
            return 0
        try:
            with sqlite3.connect(store) as db:
                return db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
        except sqlite3.OperationalError:  # the tables are being made
            return 0

    deadline = time.monotonic() + HANG
    while running() < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # until the parent and its first cell are open
    assert proc.poll() is None and running() >= 2, "hf-eval ended (or never opened its runs) before it was stopped"
    proc.send_signal(signal.Signals(number))
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == code and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        f"error: stopped by {name}: the hf-eval runs are closed KILLED; run the same command again to evaluate from "
        "the start"
    )
    with sqlite3.connect(store) as db:
        statuses = [s for (s,) in db.execute("select status from runs")]
    assert statuses and set(statuses) == {"KILLED"}
