"""Length extrapolation: score the final model on held-out windows of other lengths.

``eval.lengths=[128,256,512,1024]`` logs ``val/loss_at_<L>`` (and ``val/bpc_at_<L>`` for
byte-level tokenizers) at the final step. MLflow metric names may not contain ``@``, hence
``_at_``. The model runs in eval mode, so a scheme's eval-time scaling (if any) applies.

Rule for lengths a scheme cannot represent: the scheme refuses with a ConfigError (e.g.
pos=learned beyond its table, see positional/learned.py); that length is recorded as not
applicable — tag ``eval_skipped_at_<L>`` with the reason — and the run goes on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Subset

from harness.data.windows import EvalWindows
from harness.errors import ConfigError


@dataclass
class LengthResults:
    losses: dict[int, float] = field(default_factory=dict)  # nats per predicted token
    skipped: dict[int, str] = field(default_factory=dict)   # length -> why it was not scored


def requested_lengths(cfg: DictConfig) -> list[int]:
    """eval.lengths, validated before training starts; [] when absent or null."""
    lengths = list(cfg.get("eval", {}).get("lengths") or [])
    bad = [n for n in lengths if not isinstance(n, int) or n <= 0]
    if bad:
        raise ConfigError(f"eval.lengths={lengths}: {bad} are not positive integers; e.g. eval.lengths=[128,256]")
    return lengths


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


def log_lengths(client, run_id: str, step: int, byte_level: bool, results: LengthResults) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"val/loss_at_{n}", loss, now, step) for n, loss in results.losses.items()]
    if byte_level:  # one token per byte
        metrics += [Metric(f"val/bpc_at_{n}", loss / math.log(2), now, step) for n, loss in results.losses.items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    for n, reason in results.skipped.items():
        client.set_tag(run_id, f"eval_skipped_at_{n}", reason[:1000])
