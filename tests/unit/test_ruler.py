"""task=ruler and hf-eval --tasks (harness/data/tasks/ruler.py): each variant's example holds what RULER's definition
says, at the length asked, with a byte and a word-level tokenizer; RULER's score as lm-eval computes it; the
teacher-forced share of strings against a direct count."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from harness.data.objectives import IGNORE
from harness.data.tasks import string_hits
from harness.data.tasks.ruler import VARIANTS, Ruler, example, string_match_all
from harness.errors import ConfigError

FILLER = list(b"A quiet stretch of corpus text, with words and no digits at all. " * 200)


def byte_encode(text: str) -> list[int]:
    return list(text.encode("ascii"))


def drawn(variant: str, length: int, seed: int, encode=byte_encode, filler=FILLER):
    out = example(variant, length, encode, filler, torch.Generator().manual_seed(seed))
    assert out is not None
    prompt, answers, expected = out
    return bytes(prompt).decode() if encode is byte_encode else prompt, answers, expected


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("seed", range(5))
def test_each_variant_fits_its_length_and_asks_what_its_context_holds(variant, seed):
    length = 600
    text, answers, expected = drawn(variant, length, seed)
    assert len(text) + sum(map(len, answers)) == length
    assert [bytes(a).decode().lstrip(", ") for a in answers] == expected
    if variant.startswith("niah"):
        asked = re.search(r"What are the magic numbers for (.*)\?", text).group(1).split(", ")
        held = re.findall(r"The magic number for (\w+) is (\d+)\.", text)
        keys, values, queries = {"single": (1, 1, 1), "multikey": (4, 1, 1), "multivalue": (1, 4, 1)}.get(
            variant[5:], (4, 1, 4)
        )
        assert len({k for k, _ in held}) == keys and len(held) == keys * values and len(asked) == queries
        assert expected == [v for q in asked for k, v in held if k == q]  # query order, then appearance
    elif variant == "vt":
        value = re.search(r"Which variables hold (\d+)\?", text).group(1)
        chain = dict(re.findall(r"VAR (\w+) = (\w+|VAR \w+)\.", text))
        resolved = {}
        for name, rhs in chain.items():  # in the text's order: each hop after the one it names
            resolved[name] = resolved[rhs[4:]] if rhs.startswith("VAR ") else rhs
        assert expected == [n for n, v in resolved.items() if v == value] and len(expected) == 5
    else:
        words = re.search(r"((?: [a-z]{6})+) Which 3 words", text).group(1).split()
        counts = Counter(words)
        if variant == "cwe":
            assert (
                sorted(counts[w] for w in expected) == [4, 4, 4]
                and max(counts[w] for w in counts if w not in expected) == 2
            )
            assert expected == [w for w in dict.fromkeys(words) if w in expected]  # in order of appearance
        else:
            ranked = [c for _, c in counts.most_common()]
            assert [counts[w] for w in expected] == ranked[:3] and ranked[2] > ranked[3]  # the top 3, strictly


def test_a_word_level_tokenizer_gets_the_length_in_its_own_tokens():
    """hf-eval sizes the prompt with the model's tokenizer: here one id per word or punctuation mark."""
    vocab: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [vocab.setdefault(t, len(vocab)) for t in re.findall(r"\w+|[^\w\s]", text)]

    filler = encode("the corpus says many things about nothing in particular " * 100)
    for variant in VARIANTS:
        prompt, answers, expected = drawn(variant, 400, 0, encode, filler)
        assert len(prompt) + sum(map(len, answers)) == 400 and expected


@pytest.mark.parametrize("trial", range(30))
def test_string_match_all_is_lm_evals(trial):
    common = pytest.importorskip("lm_eval.tasks.ruler.common_utils")
    g = torch.Generator().manual_seed(trial)
    pool = ["Alpha", "beta", "1234567", "GAMMA", "x"]
    expected = [pool[int(i)] for i in torch.randint(len(pool), (1 + trial % 4,), generator=g)]
    said = " ".join(
        pool[int(i)].upper() if i % 2 else pool[int(i)] for i in torch.randint(5, (trial % 5,), generator=g)
    )
    assert string_match_all(said, expected) == common.string_match_all([said], [expected])


def test_string_hits_is_the_share_of_whole_strings_right():
    """Two rows; scored runs are the expected strings. Row 0: 3 strings, the second has a wrong token → 2/3; row 1:
    one string, all right → 1."""
    labels = torch.full((2, 10), IGNORE)
    labels[0, 1:3], labels[0, 4:6], labels[0, 7:9] = 5, 6, 7
    labels[1, 2:5] = 3
    predicted = labels.clamp(min=0).clone()
    predicted[0, 5] = 1
    logits = torch.nn.functional.one_hot(predicted, 10).float()
    assert string_hits(logits, labels).tolist() == pytest.approx([2 / 3, 1.0])


def test_the_task_scores_only_the_strings_not_their_separators():
    task = Ruler(variant="niah_multivalue")
    lay = task.layout(320, torch.Generator().manual_seed(0), torch.tensor(FILLER, dtype=torch.uint8))
    assert len(lay.tokens) == 321  # the causal form reads 320 and predicts the last
    answer = bytes(lay.tokens[lay.answer].tolist()).decode()
    assert re.fullmatch(r"\d{28}", answer)  # four 7-digit values; their ", " given
    e = task.finish(lay, 320)
    runs = (e["labels"] != IGNORE).int().diff().eq(1).sum()
    assert int(runs) == 4


def test_the_tasks_examples_are_the_generators_on_the_whole_filler():
    """task=ruler cuts from the corpus tensor what hf-eval's generator cuts from the whole split as a list."""
    filler = torch.randint(32, 127, (20_000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    for variant in sorted(VARIANTS):
        for seed in range(3):
            lay = Ruler(variant=variant).layout(600, torch.Generator().manual_seed(seed), filler)
            prompt, answers, _ = example(
                variant, 601, byte_encode, filler.tolist(), torch.Generator().manual_seed(seed)
            )
            assert lay.tokens.tolist() == prompt + [i for a in answers for i in a]


def test_bad_settings_are_one_line():
    with pytest.raises(ConfigError, match="task.variant='niah' is no RULER variant; use one of niah_single"):
        Ruler(variant="niah")
    with pytest.raises(ConfigError, match=r"below task=ruler's shortest length 272"):
        Ruler(variant="niah_multiquery", train_lengths=[128, 256], eval_lengths=[256, 1024])


@pytest.mark.parametrize("variant", ["cwe", "fwe"])
def test_cwe_and_fwe_fit_a_tokenizer_that_spells_their_words_finer_than_abcdef(variant):
    """A subword vocabulary holds "abc" and "def" but spells a drawn word letter by letter, as a BPE trained on text
    does (" abcdef" 2 of its tokens, " tjqotb" 5): the word list and the answers are sized in their own tokens."""
    vocab: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [vocab.setdefault(t, len(vocab)) for t in re.findall(r", |abc|def|.", text, re.S)]

    assert len(encode(" abcdef")) == 3 and len(encode(" tjqotb")) == 7
    filler = encode("the corpus says many things about nothing in particular " * 100)
    for length in (600, 800):
        for seed in range(10):
            prompt, answers, expected = drawn(variant, length, seed, encode, filler)
            assert len(prompt) + sum(map(len, answers)) == length and len(expected) == 3
