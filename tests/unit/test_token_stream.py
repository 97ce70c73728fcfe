"""The same token stream for every arm: cells of a sweep that share a seed train on the
same batches in the same order, whatever their scheme or attention — through the run's own path (validate,
the corpus, harness.config.build's loaders, after the model has drawn its initial weights from the seeded
global generator) — and another seed gives another stream. Examples are pure functions of (seed, index),
so no scheme's initialisation can shift them."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.helpers import validated


def _batches(*overrides: str, n: int = 4) -> list[dict[str, torch.Tensor]]:
    from harness.config.build import build

    checked = validated(*overrides)
    corpus = checked.source.load()
    checked.tokenizer.fit(corpus)
    built = build(checked, corpus, 0, logger=False, callbacks=[])
    return [
        {k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)}
        for b in itertools.islice(built.train_loader, n)
    ]


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("task", ["mlm", "clm"])
def test_two_schemes_with_one_seed_train_on_the_same_batches(task):
    rope = _batches(f"task={task}", "pos=rope", "seed=3")
    t5_local = _batches(f"task={task}", "pos=t5", "attn=local", "attn.window=8", "seed=3")
    assert _same(rope, t5_local)  # masks (MLM) and next-token targets included
    assert not _same(rope, _batches(f"task={task}", "pos=rope", "seed=4"))


def test_a_learned_table_draws_weights_but_not_the_stream():
    """pos=learned draws a (T, C) table from the global generator before the loaders exist; the stream holds."""
    assert _same(_batches("pos=none", "seed=1"), _batches("pos=learned", "seed=1"))
