"""task=mixture: several tasks in one training run, each example exactly one part's, each part scored on its own
(harness/data/tasks/mixture.py, harness/model/evaluate.py evaluate_parts), read back from MLflow."""

import re
from collections import Counter

import pytest
import torch

from harness.data.tasks import SyntheticTask
from harness.data.tasks.base import IGNORE
from harness.data.tasks.copy import Copy
from harness.data.tasks.mixture import ALPHABETS, Mixture
from harness.data.tasks.reverse import Reverse
from harness.data.tasks.sort import Sort
from harness.errors import ConfigError

PARTS = ["reverse", "copy", "sort", "missing_duplicate"]


def mixture(**kw) -> Mixture:
    return Mixture(**{"form": "encoder", "parts": PARTS, "train_lengths": [1, 6], "eval_lengths": [3, 6, 12, 24], **kw})


def answer_of(example: dict) -> tuple[list[int], list[int]]:
    """The input symbols (no [MASK]) and the scored answers of an encoder example."""
    scored = example["labels"] != IGNORE
    return example["input_ids"][~scored].tolist(), example["labels"][scored].tolist()


def test_each_example_is_one_parts_task_in_that_parts_own_symbols():
    task = mixture()
    data = task.train_dataset(seed=0, n=2000)
    counts = Counter()
    for i in range(len(data)):
        ex = data[i]
        name = PARTS[ex["part"]]
        counts[name] += 1
        given, answers = answer_of(ex)
        symbols = set(ALPHABETS[name].encode())
        assert set(given) <= symbols and set(answers) <= symbols
        n = ex["length"]
        if name == "reverse":
            assert answers == given[::-1] and len(given) == n
        elif name == "copy":
            assert answers == given
        elif name == "sort":
            assert answers == sorted(given)
        else:  # missing duplicate: w w with one blank; the answer restores the pair
            assert len(answers) == 1 and len(given) == 2 * n - 1
            full = ex["input_ids"].clone()
            full[ex["labels"] != IGNORE] = answers[0]
            assert full[:n].tolist() == full[n:].tolist()
    # the part is uniform: 500 expected each; 4 binomial sds ≈ 78
    assert all(abs(c - 500) < 80 for c in counts.values()) and set(counts) == set(PARTS)


def test_a_parts_examples_are_its_own_tasks_layouts_and_pure_functions_of_the_index():
    task = mixture()
    a, b = task.train_dataset(seed=3, n=50), task.train_dataset(seed=3, n=50)
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(50))
    # a part evaluated alone is the task of that name with the part's symbols
    part = task.parts["sort"]
    assert isinstance(part, Sort) and bytes(part.alphabet.tolist()) == b"abcde"
    assert isinstance(task.parts["reverse"], Reverse) and isinstance(task.parts["copy"], Copy)
    assert all(p.train_lengths == (1, 6) and p.eval_lengths == (3, 6, 12, 24) for p in task.parts.values())
    assert task.sequence_tokens(0) == 12  # 6 symbols and 6 output slots: every part's longest
    assert isinstance(task, SyntheticTask) and task.config_name() == "mixture" and not task.causal


def test_a_part_may_be_a_class_by_its_dotted_path():
    task = mixture(parts=["reverse", "harness.data.tasks.sort.Sort"])
    assert list(task.parts) == ["reverse", "sort"] and isinstance(task.parts["sort"], Sort)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"parts": ["reverse", "reverse"]}, "must list distinct task names"),
        ({"parts": []}, "must list distinct task names"),
        ({"parts": "reverse"}, "must list distinct task names"),
        ({"parts": ["reverse", "nonesuch"]}, "no task 'nonesuch' (harness/data/tasks/nonesuch.py)"),
        ({"parts": ["reverse", "mixture"]}, "'mixture' is not a task name"),
        ({"parts": ["reverse", "passkey"]}, "task=passkey cuts corpus text"),
        ({"parts": ["reverse", "associative_recall"]}, "task=associative_recall takes no task.alphabet"),
        (
            {"parts": ["reverse", "associative_recall"], "alphabets": {"associative_recall": "xy"}},
            "task=associative_recall takes no task.alphabet",
        ),
        ({"alphabets": {"copy": "01"}}, "the parts' symbols must be disjoint"),
        ({"parts": ["reverse", "collections.Counter"]}, "collections.Counter is not a SyntheticTask"),
        (
            {"parts": ["reverse", "nopkg_here.tasks.Shift"]},
            "cannot import 'nopkg_here.tasks.Shift'; put its package on",
        ),
        ({"form": "causal"}, "task.form='causal' is not a form of task=missing_duplicate"),
        ({"form": None, "parts": ["reverse", "missing_duplicate"]}, "different forms by default"),
    ],
)
def test_bad_mixtures_are_refused_with_the_fix(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        mixture(**kw)


def test_each_part_is_scored_on_its_own_and_read_back_from_mlflow(train_tiny):
    """A few steps of task=mixture: every part's accuracies at the training lengths and at each evaluation
    length are logged under val/<part>/, beside the pooled ones."""
    summary, client = train_tiny(
        "task=mixture",
        "task.parts=[reverse,sort]",
        "task.train_lengths=[1,3]",
        "task.eval_lengths=[2,12]",
        "task.eval_examples=16",
        "model.n_layers=1",
    )
    metrics = client.get_run(summary.run_id).data.metrics
    for part in ("reverse", "sort"):
        for key in ("acc", "token_acc", "acc_at_2", "token_acc_at_12", "loss_at_12", "blind_token_acc_at_2"):
            assert 0.0 <= metrics[f"val/{part}/{key}"] <= (100.0 if "loss" in key else 1.0), (part, key)
    assert "val/acc_at_12" in metrics and "val/token_acc_at_12" in metrics  # the pooled ones as well
    # sort's position-blind baseline is its own (the bag of a sort input fixes its answers' multiset only)
    assert metrics["val/sort/blind_token_acc_at_2"] < 1.0


class Oracle:
    """A model that answers every scored slot right except sort's (its symbols a–e), where it is always wrong."""

    device = torch.device("cpu")

    def eval(self):
        return self

    def token_losses(self, batch):
        labels = batch["labels"]
        target = labels.clamp(min=0)
        ids = batch["input_ids"]
        sort = ((ids >= ord("a")) & (ids <= ord("e"))).any(dim=1, keepdim=True)
        target = torch.where(sort, (target + 1) % 258, target)
        scored = labels != IGNORE
        return torch.zeros(labels.shape), scored, torch.nn.functional.one_hot(target, 258).float()


def test_evaluate_parts_scores_each_part_on_its_own_evaluation_sets():
    from harness.model.evaluate import evaluate_parts

    metrics, tables = evaluate_parts(Oracle(), mixture(), corpus=None, batch_size=32)
    for part in ("reverse", "copy", "missing_duplicate"):
        assert metrics[f"val/{part}/acc"] == metrics[f"val/{part}/token_acc"] == 1.0
        assert all(metrics[f"val/{part}/{k}_at_{n}"] == 1.0 for k in ("acc", "token_acc") for n in (3, 6, 12, 24))
    assert metrics["val/sort/acc"] == metrics["val/sort/token_acc"] == 0.0
    assert all(metrics[f"val/sort/token_acc_at_{n}"] == 0.0 for n in (3, 6, 12, 24))
    assert metrics["val/missing_duplicate/blind_token_acc_at_12"] == 1.0  # its blank is the odd-count symbol
    assert metrics["val/reverse/blind_token_acc_at_24"] < 0.75
    assert "sort (training lengths: per token 0.000, exact match 0.000)" in tables
    assert evaluate_parts(Oracle(), Copy(form="encoder"), corpus=None, batch_size=32) == ({}, "")  # not a mixture
