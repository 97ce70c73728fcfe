"""Each synthetic task's position-blind baseline (harness/data/tasks/blind.py): what a rule that sees only the
bag of input tokens scores, computed from the task's own draws, against definitions worked out by hand, and
logged beside the model's accuracy at every evaluation length."""

import math
from collections import Counter

import pytest
import torch

from harness.data.tasks.blind import blind_baseline
from harness.data.tasks.missing_duplicate import MissingDuplicate
from harness.data.tasks.passkey import Passkey
from harness.data.tasks.reverse import Reverse


def test_missing_duplicate_is_solved_without_positions_by_the_parity_of_the_bag():
    """In w w every symbol occurs an even number of times: the blank is the one symbol left with an odd count."""
    task, gen = MissingDuplicate(), torch.Generator().manual_seed(1)
    for length in (1, 5, 20, 80):
        for _ in range(50):
            lay = task.layout(length, gen)
            counts = Counter(lay.tokens[~lay.answer].tolist())
            [odd] = [s for s, n in counts.items() if n % 2]
            assert [odd] == lay.tokens[lay.answer].tolist()
    for length in (5, 20):
        b = blind_baseline(task, length)
        assert b.seen == 1.0 and (b.token_acc, b.acc) == (1.0, 1.0)
    b = blind_baseline(task, 80)  # some scored bags unmet while fitting: the estimate misses only those
    assert b.seen < 1.0 and b.token_acc >= b.seen


@pytest.mark.parametrize("length", [4, 5])
def test_reverse_blind_baseline_matches_the_bayes_rule_worked_out_by_enumeration(length):
    """Binary reverse, encoder form: the bag is the string's counts, every output slot gets the majority symbol.
    Per token: E[max(c, n − c)] / n over c ~ Binomial(n, ½); exact match: only the two constant strings."""
    n = length
    per_token = sum(math.comb(n, c) * max(c, n - c) for c in range(n + 1)) / (2**n * n)  # 0.6875 at n = 5
    exact = 2 / 2**n  # a tie (c = n/2) is right half the time per token and never exactly
    b = blind_baseline(Reverse(form="encoder"), length, fit=4000, score=4000)
    assert b.seen == 1.0
    slots = 4000 * n
    assert abs(b.token_acc - per_token) < 4 * math.sqrt(0.25 / slots) * 2  # the draws' error, slots correlated
    assert abs(b.acc - exact) < 4 * math.sqrt(exact * (1 - exact) / 4000)


def test_no_baseline_where_a_model_without_positions_is_not_blind():
    assert blind_baseline(Reverse(form="causal"), 5) is None  # a causal mask tells positions (Kazemnejad et al.)
    assert blind_baseline(Passkey(), 100) is None  # its bags would be the corpus's


def test_a_task_run_logs_each_lengths_baseline_beside_its_accuracy(train_tiny, capsys):
    summary, client = train_tiny("task=missing_duplicate", "task.train_lengths=[1,5]", "task.eval_lengths=[5,20]")
    metrics = client.get_run(summary.run_id).data.metrics
    for length in (5, 20):
        b = blind_baseline(MissingDuplicate(), length)
        assert metrics[f"val/blind_token_acc_at_{length}"] == b.token_acc == 1.0
        assert metrics[f"val/blind_acc_at_{length}"] == b.acc
        assert f"val/token_acc_at_{length}" in metrics
    table = capsys.readouterr().out.split("task accuracy by length")[1].splitlines()
    tok = metrics["val/token_acc_at_5"]
    assert table[1].split() == [
        "L=5",
        "per",
        "token",
        f"{tok:.3f}",
        "[1.000]",
        "exact",
        "match",
        f"{metrics['val/acc_at_5']:.3f}",
        "[1.000]",
    ]
