"""A task is one module and one YAML: a task written here, outside the project, composes, validates, trains
and attaches its own files to the run through its ``artifacts`` hook, with no project file edited; and
passkey's depth table reaches the run the same way."""

from __future__ import annotations

import csv
import io
import textwrap
from pathlib import Path

import pytest

from harness.config.check import check
from harness.config.load import load
from harness.data.tasks import ScoredTask
from tests.helpers import assert_figure

# The whole task: say the string's first symbol again after "|". Its per-example extra ``first`` and its
# artifact (right answers by first symbol) show that an example's fields reach the hook.
MODULE = '''
"""Echo the first symbol: ``w|w[0]``, scored on the last token."""

import torch

from harness.data.tasks.base import Layout, SyntheticTask, ascii_ids, symbols


class FirstSymbol(SyntheticTask):
    """Repeat the string's first symbol after "|"."""

    forms = ("causal",)

    def __init__(self, tokenizer=None, form=None, alphabet="abc", train_lengths=(1, 4), eval_lengths=(2, 16),
                 eval_examples=8):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        self.alphabet = symbols("task.alphabet", alphabet, reserved="|")

    def layout_size(self, length):
        return length + 2

    def layout(self, length, gen, filler=None):
        w = self.alphabet[torch.randint(len(self.alphabet), (length,), generator=gen)]
        tokens = torch.cat([w, ascii_ids("|"), w[:1]])
        return Layout(tokens, torch.arange(len(tokens)) == len(tokens) - 1, {"first": int(w[0])})

    def artifacts(self, results):
        rows = [f"{e.length},{chr(e.extras['first'])},{int(e.correct)}" for e in results.examples]
        return {"first_symbol.csv": "\\n".join(["length,first,correct", *rows]).encode()}
'''

YAML = """\
_target_: first_symbol.FirstSymbol
form: causal
alphabet: abc
train_lengths: [1, 4]
eval_lengths: [2, 16]
eval_examples: 8
"""


@pytest.fixture
def first_symbol(tmp_path, monkeypatch) -> list[str]:
    """first_symbol.py on sys.path and conf/task/first_symbol.yaml in a config directory of its own; returns
    the overrides that select it."""
    (tmp_path / "first_symbol.py").write_text(textwrap.dedent(MODULE))
    conf = tmp_path / "conf" / "task"
    conf.mkdir(parents=True)
    (conf / "first_symbol.yaml").write_text(YAML)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ["task=first_symbol", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]


def test_a_task_in_one_module_and_one_yaml_composes_validates_and_its_files_reach_the_run(first_symbol, train_tiny):
    spec = load(first_symbol)
    assert spec.choices.task == "first_symbol"
    task = spec.task.build(tokenizer=spec.tokenizer.build())
    assert type(task).config_name() == "first_symbol"  # its module names it, as conf/task/first_symbol.yaml
    assert isinstance(task, ScoredTask)
    assert check(spec).task.eval_lengths == (2, 16)

    summary, client = train_tiny(*first_symbol)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["task"] == "first_symbol"
    assert {"val/acc", "val/acc_at_2", "val/acc_at_16"} <= set(run.data.metrics)
    # per-token accuracy beside exact match; one answer token here, so the two agree
    assert {"val/token_acc", "val/token_acc_at_2", "val/token_acc_at_16"} <= set(run.data.metrics)
    for length in (2, 16):
        assert run.data.metrics[f"val/token_acc_at_{length}"] == run.data.metrics[f"val/acc_at_{length}"]
    names = {a.path for a in client.list_artifacts(summary.run_id)}
    assert "first_symbol.csv" in names
    rows = list(
        csv.DictReader(io.StringIO(Path(client.download_artifacts(summary.run_id, "first_symbol.csv")).read_text()))
    )
    assert len(rows) == 16 and {r["first"] for r in rows} <= set("abc")  # 8 per length, each with its extra
    for length in (2, 16):  # the hook saw the same outcomes the metrics count
        right = sum(int(r["correct"]) for r in rows if r["length"] == str(length))
        assert right / 8 == pytest.approx(run.data.metrics[f"val/acc_at_{length}"])


def test_passkey_depth_table_reaches_the_run_through_its_hook(train_tiny):
    summary, client = train_tiny(
        "task=passkey",
        "task.train_lengths=[124,130]",
        "task.eval_lengths=[124,520]",
        "task.eval_examples=4",
        "task.depth_bins=2",
    )
    names = {a.path for a in client.list_artifacts(summary.run_id)}
    assert {"passkey_depth.csv", "passkey_depth.png"} <= names
    table = Path(client.download_artifacts(summary.run_id, "passkey_depth.csv")).read_text()
    rows = list(csv.DictReader(io.StringIO(table)))
    assert [(r["length"], r["depth_lo"], r["n"]) for r in rows] == [
        ("124", "0", "2"),
        ("124", "50", "2"),
        ("520", "0", "2"),
        ("520", "50", "2"),
    ]  # depths spread evenly
    metrics = client.get_run(summary.run_id).data.metrics
    for length in (124, 520):
        right = sum(int(r["correct"]) for r in rows if r["length"] == str(length))
        assert right / 4 == pytest.approx(metrics[f"val/acc_at_{length}"])
    assert_figure(Path(client.download_artifacts(summary.run_id, "passkey_depth.png")))
