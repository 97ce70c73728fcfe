"""Evaluation beyond the validation split: text windows of other lengths, and synthetic tasks' accuracy
per length.

``eval.lengths=[128,256,512,1024]`` logs ``val/loss_at_<L>`` (and ``val/bpc_at_<L>`` for
byte-level tokenizers) at the final step. MLflow metric names may not contain ``@``, hence
``_at_``. The model runs in eval mode, so a scheme's eval-time scaling (if any) applies.

A synthetic task (harness/data/tasks/) is scored at each ``task.eval_lengths`` entry by exact match:
``val/acc_at_<L>`` (and ``val/loss_at_<L>``, nats per answer token); passkey adds its accuracy by
(length, depth) as ``passkey_depth.csv`` and ``passkey_depth.png``.

Rule for lengths a scheme cannot represent: the scheme refuses with a ConfigError (e.g.
pos=learned beyond its table, see positional/learned.py); that length is recorded as not
applicable — tag ``eval_skipped_at_<L>`` with the reason — and the run goes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, Subset

from harness.data.tasks import exact_match
from harness.data.windows import EvalWindows
from harness.errors import ConfigError


@dataclass
class LengthResults:
    losses: dict[int, float] = field(default_factory=dict)  # nats per predicted token
    skipped: dict[int, str] = field(default_factory=dict)   # length -> why it was not scored


def evaluate_lengths(module, corpus, tokenizer, objective, data, lengths: list[int]) -> LengthResults:
    results = LengthResults()
    ids = tokenizer.encode(corpus.val)
    module.eval()
    for length in lengths:
        try:
            results.losses[length] = _loss_at(module, ids, tokenizer, objective, data, length)
        except ConfigError as e:  # the scheme's explicit refusal, not an index error
            results.skipped[length] = str(e)
            print(f"eval.lengths: skipped L={length}: {e}")
    return results


def _loss_at(module, ids, tokenizer, objective, data, length: int) -> float:
    windows = EvalWindows(ids, length + objective.extra_tokens, objective, tokenizer.pad_id)
    # The same token budget at every length (data.eval_batches × batch × seq_len when that is
    # set, else the whole split), so the numbers compare and long lengths stay affordable.
    if data.eval_batches is not None:
        budget = data.eval_batches * data.batch_size * data.seq_len
        windows = Subset(windows, range(min(len(windows), max(1, budget // length))))
    batch_size = max(1, data.batch_size * data.seq_len // length)  # constant tokens per batch
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in DataLoader(windows, batch_size=batch_size):
            loss_sum, n = module._loss_sum({k: v.to(module.device) for k, v in batch.items()})
            total, count = total + float(loss_sum), count + int(n)
    return total / max(count, 1)


def length_metrics(results: LengthResults, byte_level: bool) -> dict[str, float]:
    """``val/loss_at_<L>`` (and ``val/bpc_at_<L>`` for byte-level tokenizers: one token per byte)."""
    metrics = {f"val/loss_at_{n}": loss for n, loss in results.losses.items()}
    if byte_level:
        metrics.update({f"val/bpc_at_{n}": loss / math.log(2) for n, loss in results.losses.items()})
    return metrics


@dataclass
class TaskResults:
    accuracy: dict[int, float] = field(default_factory=dict)  # exact-match accuracy per task length
    losses: dict[int, float] = field(default_factory=dict)  # nats per answer token
    skipped: dict[int, str] = field(default_factory=dict)
    depths: list[tuple[int, int, bool]] = field(default_factory=list)  # (length, depth %, right): passkey


def evaluate_task(module, task, corpus, batch_size: int) -> TaskResults:
    """Exact match of the final model at each ``task.eval_lengths`` entry."""
    results = TaskResults()
    module.eval()
    for length in task.eval_lengths:
        loader = DataLoader(task.length_data(corpus, length), batch_size=batch_size, collate_fn=task.collate)
        try:
            _score_length(module, loader, length, results)
        except ConfigError as e:  # the scheme's explicit refusal (a learned table too short)
            results.skipped[length] = str(e)
            print(f"task.eval_lengths: skipped L={length}: {e}")
    return results


def _score_length(module, loader, length: int, results: TaskResults) -> None:
    total, count, right, sequences, depths = 0.0, 0, 0, 0, []
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(module.device) for k, v in batch.items()}
            loss_sum, n, logits = module._scored(batch)
            correct = exact_match(logits, batch["labels"])
            total, count = total + float(loss_sum), count + int(n)
            right, sequences = right + int(correct.sum()), sequences + len(correct)
            if "depth" in batch:
                depths += [(length, int(d), bool(c)) for d, c in zip(batch["depth"], correct, strict=True)]
    results.accuracy[length], results.losses[length] = right / sequences, total / max(count, 1)
    results.depths += depths


def task_metrics(results: TaskResults) -> dict[str, float]:
    return {**{f"val/acc_at_{n}": acc for n, acc in results.accuracy.items()},
            **{f"val/loss_at_{n}": loss for n, loss in results.losses.items()}}
