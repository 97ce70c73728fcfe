"""RULER-style long-context tasks, generated from the seed with the haystack cut from the corpus: ``task=ruler``
trains and scores posbench's own models, ``posbench hf-eval --tasks`` a pretrained one (the same generator, the
model's tokenizer).

RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?", §3, Table 2)
defines the variants; the sentences here are posbench's own, shorter than RULER's templates so that they fit the
contexts a small model trains at:

- ``niah_single``: one needle "The magic number for KEY is VALUE." at a random depth; the key's value is asked;
- ``niah_multikey``: four needles with distinct keys, one asked (the other three distract);
- ``niah_multivalue``: one key with four values, all asked;
- ``niah_multiquery``: four needles, all four keys asked;
- ``vt`` (variable tracking): "VAR A = 12345." then four hops "VAR B = VAR A." spread through the haystack; every
  variable that holds the value is asked;
- ``cwe`` (common-word extraction): a list of words, three of them ``COMMON`` times each and the rest ``RARE`` times,
  shuffled; the three common words are asked;
- ``fwe`` (frequent-word extraction): words whose counts follow Zipf's law (α = 2, RULER's), shuffled; the three
  most frequent are asked.

Scored as RULER scores (its ``string_match_all``): the share of an example's expected strings that the answer
holds. Under hf-eval the model generates greedily and a string counts when it occurs in the output (case
ignored); here, in training's teacher-forced form, the answer lists the strings in the generator's order
(appearance, query order, or frequency) and a string counts when each of its tokens is the argmax given the
ones before it (``val/match_at_<L>``; ``val/acc_at_<L>`` is every string at once). Length = tokens in the
sequence the model reads with its whole answer.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask
from harness.errors import ConfigError

Encode = Callable[[str], list[int]]
COMMON, RARE, ZIPF = 4, 2, 2.0  # cwe's counts; fwe's exponent (RULER's α)
ASKED = 3  # words asked by cwe and fwe


@dataclass(frozen=True)
class Drawn:
    """One example before its haystack: sentences hidden in it in order (or ``words``, the whole context of cwe and
    fwe), the question, the expected strings."""

    hidden: list[str]
    question: str
    answers: list[str]
    words: list[str] | None = None


def _distinct(gen: torch.Generator, count: int, letters: str = string.ascii_lowercase, n: int = 6) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = "".join(letters[int(i)] for i in torch.randint(len(letters), (n,), generator=gen))
        words += [word] if word not in words else []
    return words


def _number(gen: torch.Generator) -> str:
    return str(1_000_000 + int(torch.randint(9_000_000, (1,), generator=gen)))  # seven digits, as RULER's values


def niah(keys: int, values: int, queries: int, gen: torch.Generator, room: int, encode: Encode) -> Drawn:
    names = _distinct(gen, keys)
    held = {k: [_number(gen) for _ in range(values)] for k in names}
    hidden = [f" The magic number for {k} is {v}." for k in names for v in held[k]]
    order = torch.randperm(len(hidden), generator=gen).tolist() if keys > 1 else range(len(hidden))
    asked = [names[int(i)] for i in torch.randperm(keys, generator=gen)[:queries]]
    return Drawn(
        [hidden[i] for i in order],
        f" What are the magic numbers for {', '.join(asked)}?",
        [v for k in asked for v in held[k]],
    )


def _variable_tracking(hops: int, gen: torch.Generator, room: int, encode: Encode) -> Drawn:
    names, value = (
        _distinct(gen, hops + 1, string.ascii_uppercase, 5),
        str(10_000 + int(torch.randint(90_000, (1,), generator=gen))),
    )
    hidden = [f" VAR {names[0]} = {value}."] + [f" VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)]
    return Drawn(hidden, f" Which variables hold {value}?", names)


def _fill(gen: torch.Generator, counts: list[int], room: int, encode: Encode) -> list[str] | None:
    """Distinct words with these counts, then more words of the last count while they fit in ``room`` tokens,
    shuffled; None when the counted ones alone do not fit."""
    words = _distinct(gen, len(counts))
    bag = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
    cost = sum(len(encode(" " + w)) for w in bag)
    if cost > room:
        return None
    while True:
        (extra,) = _distinct(gen, 1)
        more = len(encode(" " + extra)) * counts[-1]
        if cost + more > room:
            return [bag[int(i)] for i in torch.randperm(len(bag), generator=gen)]
        if extra not in words:
            words.append(extra)
            bag += [extra] * counts[-1]
            cost += more


CWE_QUESTION = f" Which {ASKED} words are the most common?"
FWE_QUESTION = f" Which {ASKED} words are the most frequent?"


def _common_words(gen: torch.Generator, room: int, encode: Encode) -> Drawn | None:
    words = _fill(gen, [COMMON] * ASKED + [RARE], room, encode)
    if words is None:
        return None
    return Drawn([], CWE_QUESTION, [w for w in dict.fromkeys(words) if words.count(w) == COMMON], words)


def _frequent_words(gen: torch.Generator, room: int, encode: Encode) -> Drawn | None:
    fit = max(1, room // len(encode(" abcdef")))  # about as many words as fit; fewer while the drawn ones do not
    while True:
        total = sum(r**-ZIPF for r in range(1, fit + 1))
        counts = [c for c in (int(fit * r**-ZIPF / total) for r in range(1, fit + 1)) if c > 1] + [1]
        if len(counts) <= ASKED or len(set(counts[: ASKED + 1])) <= ASKED:  # each asked word above the next
            return None
        words = _fill(gen, counts, room, encode)
        if words is not None:
            return Drawn([], FWE_QUESTION, sorted(dict.fromkeys(words), key=lambda w: -words.count(w))[:ASKED], words)
        fit -= max(1, fit // 10)


VARIANTS: dict[str, Callable[[torch.Generator, int, Encode], Drawn | None]] = {
    "niah_single": functools.partial(niah, 1, 1, 1),
    "niah_multikey": functools.partial(niah, 4, 1, 1),
    "niah_multivalue": functools.partial(niah, 1, 4, 1),
    "niah_multiquery": functools.partial(niah, 4, 1, 4),
    "vt": functools.partial(_variable_tracking, 4),
    "cwe": _common_words,
    "fwe": _frequent_words,
}
ANSWER = " Answer:"


def example(
    variant: str, length: int, encode: Encode, filler: Sequence[int], gen: torch.Generator
) -> tuple[list[int], list[list[int]], list[str]] | None:
    """(the prompt's ids, each expected string's ids after its separator " " or ", ", the strings) of one example
    whose prompt and answer take ``length`` tokens; None when it cannot fit. The haystack is a stretch of ``filler``
    (ids) with the hidden sentences at sorted random points; cwe's and fwe's context is their words, corpus text
    before them making up the length."""
    # cwe's and fwe's answer: a drawn word may take more tokens than "abcdef", never more than its bytes
    asked = len(encode(CWE_QUESTION + ANSWER)) + ASKED * (max(len(encode(", abcdef")), len(", abcdef")) + 2)
    drawn = VARIANTS[variant](gen, length - asked, encode)
    if drawn is None:
        return None
    answers = [encode((", " if i else " ") + a) for i, a in enumerate(drawn.answers)]
    tail = encode(drawn.question + ANSWER)
    context: list[int] = []
    if drawn.words is not None:
        context = [i for w in drawn.words for i in encode(" " + w)]
    else:
        hidden = [encode(s) for s in drawn.hidden]
        room = length - len(tail) - sum(map(len, answers)) - sum(map(len, hidden))
        if room < 0 or len(filler) < room:
            return None
        start = int(torch.randint(len(filler) - room + 1, (1,), generator=gen))
        points = sorted(torch.randint(room + 1, (len(hidden),), generator=gen).tolist())
        haystack, at = list(filler[start : start + room]), 0
        for point, sentence in zip(points, hidden, strict=True):
            context += haystack[at:point] + sentence
            at = point
        context += haystack[at:]
    pad = length - len(context) - len(tail) - sum(map(len, answers))
    if pad < 0 or len(filler) < pad:
        return None
    return list(filler[:pad]) + context + tail, answers, drawn.answers


def string_match_all(prediction: str, expected: list[str]) -> float:
    """RULER's score of one answer: the share of the expected strings it contains, case ignored."""
    return sum(e.lower() in prediction.lower() for e in expected) / len(expected)


def _bytes(text: str) -> list[int]:
    return list(text.encode("ascii"))


class Ruler(SyntheticTask):
    """A RULER-style task (the module docstring) for posbench's byte-level models; causal, as RULER's."""

    forms = ("causal",)
    needs_filler = True
    partial_credit = True  # val/match_at_<L>: the share of expected strings right (RULER's string_match_all)

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        variant: str = "niah_single",
        train_lengths=(288, 384),
        eval_lengths=(384, 768, 1536),
        eval_examples: int = 64,
    ):
        if variant not in VARIANTS:
            raise ConfigError(f"task.variant={variant!r} is no RULER variant; use one of {', '.join(VARIANTS)}")
        self.variant = variant
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)

    def min_length(self) -> int:
        return shortest(self.variant)

    def layout_size(self, length: int) -> int:
        return length + 1  # the causal form reads all but the last token

    def check_filler(self, filler: Tensor | None, longest: int) -> None:
        held = len(self.given_filler(filler))
        if held < longest:
            raise ConfigError(
                f"the filler text holds {held} bytes, fewer than a task=ruler example of "
                f"length {longest} may cut; use a larger corpus or shorter lengths"
            )

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        drawn = example(self.variant, length + 1, _bytes, self.given_filler(filler).numpy().data, gen)
        if drawn is None:
            raise ConfigError(f"task=ruler task.variant={self.variant} does not fit length {length}; raise it")
        prompt, answers, texts = drawn
        tokens, answer = list(prompt), [False] * len(prompt)
        for ids, text in zip(answers, texts, strict=True):
            tokens += ids
            answer += [False] * (len(ids) - len(text)) + [True] * len(text)  # the separator is given, not asked
        return Layout(torch.tensor(tokens), torch.tensor(answer))


@functools.cache
def shortest(variant: str) -> int:
    """The shortest length (a multiple of 8) at which twenty draws of a byte-level example all fit (every variant
    of ``VARIANTS`` fits one below 4096; the draws are seeded, so the answer is a constant of the variant)."""
    filler = _bytes("x" * 4096)
    return next(
        length
        for length in range(32, 4096, 8)
        if all(example(variant, length + 1, _bytes, filler, torch.Generator().manual_seed(i)) for i in range(20))
    )
