"""Synthetic tasks (harness/data/tasks) and the order-shuffling helper (harness/data/loaders.py):
deterministic from (seed, index), exact formats decoded literally, labels only where intended,
exact match, padding, per-example outcomes, the passkey depth table and its artifacts hook, and a tiny
model that learns copy."""

from __future__ import annotations

import csv
import io
import re

import numpy as np
import pytest
import torch
from torch import nn

from harness.config.catalog import option_classes
from harness.data.loaders import real_permutation, shuffle_within_window
from harness.data.objectives import IGNORE, CausalLM, MaskedLM
from harness.data.tasks import ScoredExample, SyntheticTask, TaskResults, exact_match, token_hits
from harness.data.tasks.associative_recall import AssociativeRecall
from harness.data.tasks.copy import Copy
from harness.data.tasks.missing_duplicate import MissingDuplicate
from harness.data.tasks.passkey import NEEDLE, QUESTION, Passkey, depth_files, depth_table
from harness.data.tasks.reverse import Reverse
from harness.data.tasks.ruler import Ruler
from harness.data.tasks.sort import Sort
from harness.data.tokenizer import ByteTokenizer
from harness.data.windows import with_document_ids
from harness.errors import ConfigError
from tests.helpers import ROOT, assert_figure

MASK, PAD = 257, 256
# Filler without digits, so the key's digits are the only ones in a passkey example.
FILLER = b"".join(
    b"Sentence %b of the filler text, with words and no numbers at all. " % w
    for w in (b"one", b"two", b"three", b"four", b"five", b"six", b"seven", b"eight") * 8
)
TASK_CLASSES = {name: cls for name, cls in option_classes("task").items() if issubclass(cls, SyntheticTask)}
TASKS = sorted(TASK_CLASSES)  # every conf/task option but the language-modelling objectives (mlm, clm)


def gen(i: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(i)


def text(ids) -> str:
    """Decoded ids, [MASK] shown as '_' (padding dropped)."""
    return "".join("_" if int(i) == MASK else chr(int(i)) for i in ids if int(i) != PAD)


def full_string(e: dict, causal: bool) -> str:
    """The whole causal string: the inputs plus the final target (which is no input)."""
    return text(e["input_ids"]) + (chr(int(e["labels"][-1])) if causal else "")


def scored(e: dict) -> str:
    return "".join(chr(int(t)) for t in e["labels"] if int(t) != IGNORE)


def all_tasks(filler=FILLER):
    """(task, filler) for every task and form; passkey's lengths made short for speed."""
    return [
        (Copy(), None),
        (Copy(form="encoder"), None),
        (Reverse(), None),
        (Reverse(form="encoder"), None),
        (Sort(), None),
        (Sort(form="encoder"), None),
        (MissingDuplicate(), None),
        (AssociativeRecall(), None),
        (Passkey(train_lengths=[130, 160], eval_lengths=[140, 640]), filler),
        (Passkey(form="encoder", train_lengths=[130, 160], eval_lengths=[140, 640]), filler),
        (Ruler(train_lengths=[100, 128], eval_lengths=[128, 512]), filler),
    ]


def task_id(x) -> str:
    return f"{x.config_name()}-{x.form}" if isinstance(x, SyntheticTask) else ""  # the filler: no id


# --- configs ----------------------------------------------------------------------------------


def test_every_task_and_form_is_in_the_example_checks():
    """all_tasks() builds each task by hand (its constructor arguments, passkey's filler): a new conf/task option
    fails here until its forms are in it."""
    # mixture: a task made of the others, whose examples tests/unit/test_task_mixture.py checks
    declared = {(name, form) for name, cls in TASK_CLASSES.items() if name != "mixture" for form in cls.forms}
    assert {(task.config_name(), task.form) for task, _ in all_tasks()} == declared


@pytest.mark.parametrize("name", TASKS)
def test_each_config_builds_its_task(name):
    from harness.config.load import load

    assert (ROOT / "conf" / "task" / f"{name}.yaml").exists()
    spec = load([f"task={name}"])
    task = spec.task.build(tokenizer=spec.tokenizer.build())
    assert task.config_name() == name and task.causal == (task.form == "causal")
    assert type(task).__module__ == f"harness.data.tasks.{name}"  # conf/task/<name>.yaml ↔ tasks/<name>.py
    assert task.eval_lengths[-1] >= 4 * task.train_lengths[1]
    assert task.tokens_for(task.train_lengths[1]) > task.train_lengths[0]


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: MissingDuplicate(form="causal"),
            "task.form='causal' is not a form of task=missing_duplicate; use task.form=encoder",
        ),
        (lambda: AssociativeRecall(form="encoder"), "use task.form=causal (a bidirectional model without positions"),
        (lambda: Copy(form="decoder"), "use task.form=causal or task.form=encoder"),
        (lambda: Copy(train_lengths=[40]), "task.train_lengths=[40] must be [shortest, longest]"),
        (lambda: Copy(train_lengths=[20, 1]), "must be [shortest, longest]"),
        (lambda: Copy(train_lengths="1-20"), "must be a list of integers"),
        (lambda: Copy(train_lengths=[0, 20]), "[0] below task=copy's shortest length 1"),
        (lambda: Copy(eval_lengths=[10, 20, 40]), "must reach 4 × the longest training length (80); add 80"),
        (lambda: Copy(eval_lengths=[80, 40]), "non-empty increasing list"),
        (lambda: Copy(alphabet="a"), "at least 2 distinct characters"),
        (lambda: Copy(alphabet="ab|"), "contains '|'"),
        (lambda: Copy(alphabet="a b"), "contains ' '"),
        (lambda: AssociativeRecall(eval_lengths=[4, 64]), "64 exceeds task=associative_recall's longest length 52"),
        (lambda: AssociativeRecall(keys="abc", values="cde"), "share 'c'; keep them disjoint"),
        (
            lambda: Passkey(train_lengths=[100, 200], eval_lengths=[800]),
            "[100] below task=passkey's shortest length 123",
        ),
        (lambda: Passkey(depth_bins=20), "task.depth_bins=20 must be an integer in 1..10"),
        (lambda: Copy(eval_examples=0), "task.eval_examples=0 must be a positive integer"),
        (lambda: Copy(tokenizer=type("T", (), {"byte_level": False})()), "use tokenizer=byte"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


# --- determinism, lengths, sizes --------------------------------------------------------------


@pytest.mark.parametrize("task, filler", all_tasks(), ids=task_id)
def test_examples_are_pure_functions_of_seed_and_index(task, filler):
    ds = task.train_dataset(seed=3, n=12, filler=filler)
    backwards = [ds[i] for i in reversed(range(12))][::-1]
    for i in range(12):
        for key in ("input_ids", "labels", "key_padding_mask"):
            assert torch.equal(ds[i][key], backwards[i][key])
    other = task.train_dataset(seed=4, n=12, filler=filler)
    assert any(not torch.equal(ds[i]["input_ids"], other[i]["input_ids"]) for i in range(12))
    # evaluation draws its own streams, even at the training seed and lengths
    same_seed = task.eval_dataset(None, n=12, seed=3, filler=filler)
    assert any(not torch.equal(ds[i]["input_ids"], same_seed[i]["input_ids"]) for i in range(12))
    ev = task.eval_dataset(task.train_lengths[1], n=12, filler=filler)
    train_max = [e for e in (ds[i] for i in range(12)) if e["length"] == task.train_lengths[1]]
    assert all(not torch.equal(e["input_ids"], ev[i]["input_ids"]) for i, e in enumerate(train_max))


@pytest.mark.parametrize("task, filler", all_tasks(), ids=task_id)
def test_lengths_in_range_and_tokens_for_is_the_sequence_length(task, filler):
    lo, hi = task.train_lengths
    ds = task.train_dataset(seed=0, n=200, filler=filler)
    lengths = [ds[i]["length"] for i in range(200)]
    assert min(lengths) == lo and max(lengths) == hi  # uniform over the whole range, ends included
    for i in range(20):
        e = ds[i]
        T = task.tokens_for(e["length"])
        assert e["input_ids"].shape == e["labels"].shape == e["key_padding_mask"].shape == (T,)
        assert e["key_padding_mask"].all() and (e["labels"] != IGNORE).any()
    for length in task.eval_lengths:
        e = task.eval_dataset(length, n=2, filler=filler)[1]
        assert e["length"] == length and len(e["input_ids"]) == task.tokens_for(length)
    with pytest.raises(ConfigError, match="below task="):
        task.eval_dataset(task.min_length() - 1, n=1, filler=filler)
    in_dist = task.eval_dataset(None, n=50, filler=filler)
    assert {in_dist[i]["length"] for i in range(50)} <= set(range(lo, hi + 1))


# --- exact formats ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls, f", [(Copy, lambda w: w), (Reverse, lambda w: w[::-1])])
def test_copy_and_reverse_causal_format(cls, f):
    task = cls()
    for i in range(30):
        e = task.train_dataset(seed=1, n=30)[i]
        n = e["length"]
        s = full_string(e, causal=True)
        w = s[:n]
        assert s == w + "|" + f(w) + "." and set(w) <= set("abcdefghijklmnopqrstuvwxyz")
        # scored: exactly the output and the terminator, each label the next character
        assert scored(e) == f(w) + "."
        assert (e["labels"][:n] == IGNORE).all() and (e["labels"][n:] != IGNORE).all()
        assert e["labels"][n:].tolist() == e["input_ids"][n + 1 :].tolist() + [ord(".")]


@pytest.mark.parametrize("cls, f", [(Copy, lambda w: w), (Reverse, lambda w: w[::-1])])
def test_copy_and_reverse_encoder_format(cls, f):
    task = cls(form="encoder")
    assert not task.causal
    for i in range(30):
        e = task.train_dataset(seed=1, n=30)[i]
        n = e["length"]
        s = text(e["input_ids"])
        w = s[:n]
        assert s == w + "_" * n and set(w) <= {"0", "1"}  # binary, [MASK] output slots, no separator
        assert scored(e) == f(w)
        assert (e["labels"][:n] == IGNORE).all() and (e["input_ids"][n:] == MASK).all()


@pytest.mark.parametrize("form, alphabet", [("causal", "0123456789"), ("encoder", "01234")])
def test_sort_outputs_the_symbols_in_ascending_order(form, alphabet):
    task = Sort(form=form)
    seen = set()
    for e in task.train_dataset(seed=2, n=40):
        n = e["length"]
        w = text(e["input_ids"])[:n]
        assert scored(e) == "".join(sorted(w)) + ("." if form == "causal" else "") and set(w) <= set(alphabet)
        seen |= set(w)
    assert seen == set(alphabet)  # the paper's alphabet by default: digits, or bucket sort's five symbols
    for e in Sort(form="encoder", alphabet="ba", train_lengths=[6, 8]).train_dataset(seed=0, n=10):
        out = scored(e)  # by byte value, whatever order the alphabet is written in
        assert out == "a" * out.count("a") + "b" * out.count("b")


def test_missing_duplicate_blank_is_the_label():
    task = MissingDuplicate()
    blanks = set()
    for i in range(40):
        e = task.train_dataset(seed=2, n=40)[i]
        n, b = e["length"], e["blank"]
        s = text(e["input_ids"])
        assert len(s) == 2 * n and s[b] == "_" and s.count("_") == 1
        twin = b + n if b < n else b - n  # the same symbol, |w| positions away
        assert (e["labels"] != IGNORE).nonzero().flatten().tolist() == [b]
        assert chr(int(e["labels"][b])) == s[twin]
        filled = s[:b] + s[twin] + s[b + 1 :]
        assert filled[:n] == filled[n:]
        blanks.add(b < n)
    assert blanks == {True, False}  # the blank falls in either copy


def test_associative_recall_answers_are_the_queried_values():
    task = AssociativeRecall()
    for i in range(30):
        e = task.train_dataset(seed=5, n=30)[i]
        n = e["length"]
        s = full_string(e, causal=True)
        context, queries = s[: 2 * n], s[2 * n + 1 :]
        assert s[2 * n] == "|" and len(queries) == 2 * n
        pairs = dict(zip(context[0::2], context[1::2], strict=True))
        assert len(pairs) == n and all(k.isalpha() for k in pairs) and all(v.isdigit() for v in pairs.values())
        assert sorted(queries[0::2]) == sorted(pairs)  # every key queried once
        assert scored(e) == "".join(pairs[q] for q in queries[0::2])
        # each answer is scored at its query key's position (the next-token target)
        for j, q in enumerate(queries[0::2]):
            assert e["input_ids"][2 * n + 1 + 2 * j] == ord(q)
            assert chr(int(e["labels"][2 * n + 1 + 2 * j])) == pairs[q]
        assert int((e["labels"] != IGNORE).sum()) == n


@pytest.mark.parametrize("form", ["causal", "encoder"])
def test_passkey_key_at_the_stated_depth_and_labels_are_its_digits(form):
    task = Passkey(form=form, train_lengths=[130, 200], eval_lengths=[800])
    for i in range(20):
        e = task.train_dataset(seed=6, n=20, filler=FILLER)[i]
        s = full_string(e, causal=task.causal)
        assert len(e["input_ids"]) == e["length"]
        key = s[s.index("The pass key is ") + 16 :][:5]
        assert key.isdigit() and 10_000 <= int(key) <= 99_999
        needle = NEEDLE.format(key=key)
        b, F = s.index(needle), task.filler_size(e["length"])
        assert e["depth"] == 100 * b // F
        rest = s[b + len(needle) :]
        answer = key if task.causal else "_____"
        assert rest.endswith(QUESTION + answer)
        assert (s[:b] + rest[: -len(QUESTION + answer)]).encode() in FILLER  # one contiguous stretch of filler
        assert scored(e) == key and int((e["labels"] != IGNORE).sum()) == 5
        assert sum(c.isdigit() for c in s) == (15 if task.causal else 10)  # twice in the needle (+ the answer)


def test_passkey_evaluation_spreads_depths_evenly_and_refuses_missing_filler():
    task = Passkey(train_lengths=[130, 200], eval_lengths=[800], depth_bins=10)
    ds = task.eval_dataset(300, n=50, filler=FILLER)
    table = depth_table([(ds[i]["length"], ds[i]["depth"], True) for i in range(50)], n_bins=10)
    assert table.total.flatten().tolist() == [5] * 10
    with pytest.raises(ConfigError, match="filler=corpus.train"):
        task.train_dataset(seed=0, n=4)
    with pytest.raises(ConfigError, match="fewer than the"):
        task.eval_dataset(800, n=4, filler=FILLER[:500])


# --- batching and scoring ---------------------------------------------------------------------


def test_collate_right_pads_and_stacks_integer_fields():
    task = Passkey(train_lengths=[130, 200], eval_lengths=[800])
    a, b = task.eval_dataset(130, n=1, filler=FILLER)[0], task.eval_dataset(140, n=1, filler=FILLER)[0]
    batch = task.collate([a, b])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["key_padding_mask"].shape == (2, 140)
    assert torch.equal(batch["input_ids"][0, :130], a["input_ids"])  # positions start at 0 on the left
    assert (batch["input_ids"][0, 130:] == PAD).all() and (batch["labels"][0, 130:] == IGNORE).all()
    assert batch["key_padding_mask"][0].sum() == 130 and batch["key_padding_mask"][1].all()
    assert batch["length"].tolist() == [130, 140] and batch["depth"].tolist() == [a["depth"], b["depth"]]
    assert task.collate([a])["input_ids"].shape == (1, 130)


def test_exact_match_needs_every_scored_position():
    labels = torch.tensor([[IGNORE, 2, 3], [IGNORE, 2, 3], [1, IGNORE, 3], [IGNORE, 0, IGNORE]])
    pred = torch.tensor([[0, 2, 3], [0, 2, 1], [1, 0, 3], [3, 1, 3]])  # argmax per position
    logits = torch.nn.functional.one_hot(pred, 4).float() * 5 - 1  # (B, T, V)
    # row 0 right; row 1 wrong at a scored position; row 2 wrong only where unscored; row 3 wrong
    assert exact_match(logits, labels).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="no scored position"):
        exact_match(logits[:1], torch.full((1, 3), IGNORE))


def test_token_hits_count_the_scored_positions_argmax_gets_right():
    """Per-token accuracy (Ruoss et al. 2023): right answer tokens ÷ answer tokens, over the batch; the rows
    exact match calls wrong still count the tokens they got right."""
    labels = torch.tensor([[IGNORE, 2, 3], [IGNORE, 2, 3], [1, IGNORE, 3], [IGNORE, 0, IGNORE]])
    pred = torch.tensor([[0, 2, 3], [0, 2, 1], [1, 0, 3], [3, 1, 3]])
    logits = torch.nn.functional.one_hot(pred, 4).float() * 5 - 1
    right, scored = token_hits(logits, labels)
    assert (int(right), int(scored)) == (2 + 1 + 2 + 0, 2 + 2 + 2 + 1)


def test_depth_table_and_files_hold_the_right_numbers():
    records = [
        (100, 5, True),
        (100, 5, False),
        (100, 95, True),
        (100, 100, True),  # 100 % joins the last bin
        (400, 15, False),
        (400, 55, True),
        (400, 59, True),
        (400, 60, False),
    ]
    table = depth_table(records, n_bins=10)
    assert table.lengths == (100, 400)
    assert table.total[:, 0].tolist() == [2, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    assert table.correct[:, 1].tolist() == [0, 0, 0, 0, 0, 2, 0, 0, 0, 0]
    acc = table.accuracy
    assert acc[0, 0] == 0.5 and acc[9, 0] == 1.0 and acc[1, 1] == 0.0 and acc[6, 1] == 0.0 and np.isnan(acc[3, 0])
    files = depth_files(records, n_bins=10)
    rows = list(csv.DictReader(io.StringIO(files["passkey_depth.csv"].decode())))
    assert len(rows) == 20
    assert rows[0] == {
        "length": "100",
        "depth_lo": "0",
        "depth_hi": "10",
        "n": "2",
        "correct": "1",
        "accuracy": "0.500000",
    }
    assert rows[15] == {
        "length": "400",
        "depth_lo": "50",
        "depth_hi": "60",
        "n": "2",
        "correct": "2",
        "accuracy": "1.000000",
    }
    assert rows[3]["n"] == "0" and rows[3]["accuracy"] == ""
    image = assert_figure(files["passkey_depth.png"])
    assert image.shape[0] > image.shape[1]  # 10 depth bins down, 2 lengths across: taller than wide


def test_passkey_artifacts_hook_writes_the_depth_table_of_the_scored_examples(tmp_path):
    records = [(100, 5, True), (100, 95, False), (400, 15, False), (400, 55, True)]
    results = TaskResults(examples=[ScoredExample(n, c, {"depth": d}) for n, d, c in records])
    files = Passkey(train_lengths=[130, 200], eval_lengths=[800], depth_bins=2).artifacts(results)
    assert set(files) == {"passkey_depth.csv", "passkey_depth.png"}
    rows = list(csv.DictReader(io.StringIO(files["passkey_depth.csv"].decode())))
    assert [(r["length"], r["depth_lo"], r["n"], r["correct"]) for r in rows] == [
        ("100", "0", "1", "1"),
        ("100", "50", "1", "0"),
        ("400", "0", "1", "0"),
        ("400", "50", "1", "1"),
    ]
    assert_figure(files["passkey_depth.png"])
    assert Passkey(train_lengths=[130, 200], eval_lengths=[800]).artifacts(TaskResults()) == {}  # all skipped
    assert Copy().artifacts(results) == {}  # a task without files of its own


def test_evaluation_keeps_each_examples_length_outcome_and_extras():
    from harness.model.evaluate import scored_examples

    task = Passkey(train_lengths=[130, 200], eval_lengths=[800])
    examples = [task.eval_dataset(length, n=2, filler=FILLER)[i] for length in (130, 140) for i in range(2)]
    got = scored_examples(task.collate(examples), torch.tensor([True, False, False, True]))
    assert got == [
        ScoredExample(e["length"], c, {"depth": e["depth"]})
        for e, c in zip(examples, [True, False, False, True], strict=True)
    ]
    blank = MissingDuplicate().eval_dataset(5, n=1)[0]
    assert scored_examples(MissingDuplicate().collate([blank]), torch.tensor([True]))[0].extras == {
        "blank": blank["blank"]
    }


# --- order shuffling -------------------------------------------------------


def test_real_permutation_moves_only_real_positions():
    valid = torch.tensor([True] * 6 + [False] * 3)
    perms = [real_permutation(valid, gen(i)) for i in range(20)]
    for p in perms:
        assert sorted(p[:6].tolist()) == list(range(6)) and p[6:].tolist() == [6, 7, 8]
    assert len({tuple(p.tolist()) for p in perms}) > 10
    assert torch.equal(real_permutation(valid, gen(3)), real_permutation(valid, gen(3)))


def test_mlm_shuffle_keeps_the_multiset_and_moves_targets_with_their_tokens():
    tok = ByteTokenizer()
    window = torch.tensor(list(b"the cat sat on the mat, the end"), dtype=torch.long)
    valid = torch.arange(len(window)) < 25  # a padded tail
    window[~valid] = tok.pad_id
    ex = MaskedLM(tok, mask_prob=0.3).make_example(window, valid, gen(0))
    sh = shuffle_within_window(ex, gen(1))
    assert not torch.equal(sh["input_ids"], ex["input_ids"])
    assert torch.equal(sh["key_padding_mask"], ex["key_padding_mask"])
    assert (sh["input_ids"][25:] == tok.pad_id).all() and (sh["labels"][25:] == IGNORE).all()
    pairs = lambda e: sorted(zip(e["input_ids"].tolist(), e["labels"].tolist(), strict=True))  # noqa: E731
    assert pairs(sh) == pairs(ex)  # each (input, target) pair intact: a [MASK] keeps its target
    masked = sh["input_ids"] == tok.mask_id
    assert (sh["labels"][masked] != IGNORE).all()


@pytest.mark.parametrize("n_real", [17, 12])  # a full window and a padded one
def test_causal_shuffle_permutes_the_raw_window_before_the_shift(n_real):
    tok, clm = ByteTokenizer(), CausalLM(ByteTokenizer())
    window = torch.tensor(list(b"abcdefghijklmnopq"), dtype=torch.long)  # 17 = 16 inputs + 1
    valid = torch.arange(17) < n_real
    window[~valid] = tok.pad_id
    ours = shuffle_within_window(clm.make_example(window, valid, gen(0)), gen(5), causal=True)
    reference = clm.make_example(window[real_permutation(valid, gen(5))], valid, gen(0))
    assert torch.equal(ours["input_ids"], reference["input_ids"])  # the same permuted text
    # next-token targets of the permuted text, except the window's first token ('a') keeps its
    # unscored status wherever it lands
    differ = (ours["labels"] != reference["labels"]).nonzero().flatten().tolist()
    assert len(differ) <= 1 and all(int(reference["labels"][t]) == ord("a") for t in differ)
    assert sorted(window[real_permutation(valid, gen(5))][valid].tolist()) == sorted(window[valid].tolist())
    assert not torch.equal(ours["input_ids"], clm.make_example(window, valid, gen(0))["input_ids"])


@pytest.mark.parametrize("causal", [False, True])
def test_a_packed_window_is_shuffled_inside_each_document(causal):
    """With attention kept inside documents, each document of the shuffled twin holds its own tokens (permuted), so a
    model blind to order loses nothing; each document's order still changes."""
    tok = ByteTokenizer()
    objective = CausalLM(tok) if causal else MaskedLM(tok, mask_prob=0.3)
    text = b"first document here|second one|and the third document"
    window = torch.tensor(list(text + b"x" * causal), dtype=torch.long)
    valid = torch.ones(len(window), dtype=torch.bool)
    firsts = np.zeros(len(window), dtype=bool)
    firsts[[text.index(b"|") + 1, text.rindex(b"|") + 1]] = True
    moved = 0
    for i in range(10):
        ex = with_document_ids(objective.make_example(window, valid, gen(i)), firsts, 0, len(window))
        sh = shuffle_within_window(ex, gen(100 + i), causal=causal)
        assert torch.equal(sh["document_ids"], ex["document_ids"])
        raw = lambda e: torch.cat([e["input_ids"], e["labels"][-1:]]) if causal else e["input_ids"]  # noqa: E731
        documents = torch.cat([ex["document_ids"], ex["document_ids"][-1:]]) if causal else ex["document_ids"]
        for d in documents.unique():
            here = documents == d
            assert sorted(raw(sh)[here].tolist()) == sorted(raw(ex)[here].tolist())
            moved += int(not torch.equal(raw(sh)[here], raw(ex)[here]))
    assert moved > 20


def test_causal_shuffle_of_a_task_example_keeps_its_tokens_and_moves_targets_with_them():
    task = Copy()
    for i in range(10):
        e = task.eval_dataset(12, n=10)[i]
        sh = shuffle_within_window(e, gen(i), causal=True)
        inputs, labels = sh["input_ids"].tolist(), sh["labels"].tolist()
        before = sorted(full_string(e, causal=True))
        leftover = list(before)
        for c in text(inputs):
            leftover.remove(c)  # the inputs are the permuted string but one token…
        assert len(leftover) == 1 and (labels[-1] == IGNORE or chr(labels[-1]) == leftover[0])  # …the last
        for t, y in enumerate(labels[:-1]):
            assert y == IGNORE or y == inputs[t + 1]  # a target is the token that follows
        targets = sorted(t for t in e["labels"].tolist() if t != IGNORE)
        kept = sorted(t for t in labels if t != IGNORE)
        lost = [] if len(kept) == len(targets) else [inputs[0]]  # a scored token landing at 0 has no predictor
        assert sorted(kept + lost) == targets


# --- learnable --------------------------------------------------------------------------------


class TinyCausalLM(nn.Module):
    """One pre-LN layer, learned positions: the smallest model that can copy."""

    def __init__(self, vocab: int = 258, d: int = 64, max_len: int = 32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.layer = nn.TransformerEncoderLayer(
            d, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, key_padding_mask):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T))  # (B, T, d)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True: may not attend
        return self.head(self.layer(x, src_mask=causal, src_key_padding_mask=~key_padding_mask, is_causal=True))


def test_a_one_layer_model_overfits_a_handful_of_copy_examples():
    torch.manual_seed(0)
    task = Copy(alphabet="abcdefgh", train_lengths=[3, 6], eval_lengths=[24])
    batch = task.collate([task.train_dataset(seed=0, n=8)[i] for i in range(8)])
    model = TinyCausalLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    right, losses = [], []
    for _ in range(300):  # far more than it needs; stops at the first step with all 8 exactly right
        logits = model(batch["input_ids"], batch["key_padding_mask"])
        right.append(int(exact_match(logits, batch["labels"]).sum()))
        if right[-1] == 8:
            break
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert right[0] == 0 and right[-1] == 8, right
    assert losses[-1] < 0.1 * losses[0]
