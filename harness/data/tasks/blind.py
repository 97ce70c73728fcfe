"""A synthetic task's position-blind baseline: the best score of a predictor that never sees positions.

A bidirectional model without positions is permutation-equivariant: what it outputs at a slot is a function of
that slot's input token and of the multiset (the *bag*) of all the input tokens. In the encoder form every
scored slot holds the same [MASK], so such a model gives every answer slot of an input one and the same
answer, a function of the bag alone. The best such function answers each bag with the answer most often found
at its scored slots in the task's own distribution (the Bayes rule), which this module estimates per length by
sampling the task's layouts: the rule is fitted on ``fit`` draws and scored on ``score`` other draws (held out,
so a bag met once is not counted as solved); a bag not met while fitting gets the most frequent answer overall,
so where bags rarely repeat (a large alphabet, long strings) the estimate is a lower bound and ``seen`` says how
many scored bags the rule had met.

Per-token accuracy counts the scored slots answered right; exact match the inputs with every slot right. Not
defined for causal forms: a causal mask tells a model without positions where it is (Kazemnejad et al. 2023).
Why it matters: missing_duplicate's blank is the one symbol whose count in the bag is odd, so a position-blind
rule solves it exactly (1.0 at every length; the estimate, a lower bound, reads a little less where bags go
unmet); a model scoring 1.0 there has shown nothing about positions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Blind:
    token_acc: float  # share of the scored slots a position-blind rule answers right
    acc: float  # share of the inputs with every scored slot right
    seen: float  # share of the scored inputs whose bag the rule met while fitting


def _draw(task, length: int, gen: torch.Generator) -> tuple[tuple, list[int]]:
    """The bag of one input (the answers become one [MASK] count) and its answers in order."""
    lay = task.layout(length, gen)
    given = lay.tokens[~lay.answer].tolist()
    bag = tuple(sorted(Counter(given).items())) + (("mask", int(lay.answer.sum())),)
    return bag, lay.tokens[lay.answer].tolist()


def blind_baseline(task, length: int, fit: int = 2000, score: int = 500, seed: int = 0) -> Blind | None:
    """The position-blind baseline of ``task`` at ``length`` (None for a causal form, or a task whose layouts
    need corpus text, whose bags would be the corpus's)."""
    if task.causal or task.needs_filler:
        return None
    gen = torch.Generator().manual_seed(seed)
    by_bag: dict[tuple, Counter] = {}
    overall: Counter = Counter()
    for _ in range(fit):
        bag, answers = _draw(task, length, gen)
        by_bag.setdefault(bag, Counter()).update(answers)
        overall.update(answers)
    fallback = overall.most_common(1)[0][0]
    slots = hits = exact = seen = 0
    for _ in range(score):
        bag, answers = _draw(task, length, gen)
        counts = by_bag.get(bag)
        guess = counts.most_common(1)[0][0] if counts else fallback
        right = sum(a == guess for a in answers)
        slots, hits = slots + len(answers), hits + right
        exact += right == len(answers)
        seen += counts is not None
    return Blind(hits / slots, exact / score, seen / score)
