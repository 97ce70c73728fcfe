"""Evaluation beyond the validation split: text windows of other lengths, and synthetic tasks' accuracy
per length.

``eval.lengths=[128,256,512,1024]`` logs ``val/loss_at_<L>`` (and ``val/bpc_at_<L>``, bits per byte)
at the final step. MLflow metric names may not contain ``@``, hence
``_at_``. The model runs in eval mode, so a scheme's eval-time scaling (if any) applies.

A synthetic task (harness/data/tasks/) is scored at each ``task.eval_lengths`` entry by exact match,
``val/acc_at_<L>`` (Kazemnejad et al. 2023), and by per-token accuracy over the answer tokens,
``val/token_acc_at_<L>`` (Ruoss et al. 2023), with ``val/loss_at_<L>`` (nats per answer token), and beside
them what a position-blind rule scores on the same length, ``val/blind_acc_at_<L>`` and
``val/blind_token_acc_at_<L>`` (harness/data/tasks/blind.py; encoder forms). Every
example's outcome is kept with its integer fields (its length and the task's extras) in
``TaskResults.examples``, which the task's ``artifacts`` hook turns into files of its own.

Rule for lengths a scheme cannot represent: the scheme refuses with a ConfigError (e.g.
pos=learned beyond its table, see positional/learned.py); that length is recorded as not
applicable — tag ``eval_skipped_at_<L>`` with the reason — and the run goes on.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from harness.data.loaders import on_device
from harness.data.tasks import (
    FORM_FIELDS,
    ScoredExample,
    ScoredTask,
    TaskResults,
    exact_match,
    string_hits,
    token_hits,
)
from harness.data.tasks.blind import blind_baseline
from harness.data.tokenizer import document_firsts, split_ids
from harness.data.windows import EvalWindows
from harness.errors import ConfigError
from harness.model.module import bits_per_byte


@dataclass
class LengthResults:
    losses: dict[int, float] = field(default_factory=dict)  # nats per predicted token, non-overlapping windows
    skipped: dict[int, str] = field(default_factory=dict)  # length -> why it was not scored
    positions: dict[int, WindowScores] = field(default_factory=dict)  # the non-overlapping windows by position
    sliding: dict[int, float] = field(default_factory=dict)  # eval.stride: each window scores its new tokens
    last: dict[int, float] = field(default_factory=dict)  # eval.same_targets: the same final K tokens per sample
    stride: int | None = None
    keep: int | None = None


@dataclass(frozen=True)
class WindowScores:
    """Summed cross-entropy (nats) and scored-token count at each position of a window, float64, (T,) each."""

    loss_sum: torch.Tensor
    count: torch.Tensor

    @property
    def loss(self) -> float:
        return float(self.loss_sum.sum() / self.count.sum().clamp(min=1))


def evaluate_lengths(
    module,
    corpus,
    tokenizer,
    objective,
    data,
    lengths: list[int],
    stride: int | None = None,
    same_targets: int | None = None,
    context=lambda length: nullcontext(),
) -> LengthResults:
    """Non-overlapping windows at each length; with ``stride``, sliding windows too; with ``same_targets``
    K, the last K tokens of the same samples at every length (causal objectives: config/pairings.py refuses others).
    ``context(length)``: what applies while scoring at that length (a length scaling)."""
    results = LengthResults(stride=stride, keep=same_targets)
    ids = split_ids(corpus, tokenizer, "val")
    firsts = document_firsts(corpus, "val")  # packed documents' first tokens, when the run asks for them
    ends = _sample_ends(len(ids) - objective.extra_tokens, max(lengths), _budget(data)) if same_targets else []
    module.eval()
    for length in lengths:
        try:
            with context(length):
                _score_length_windows(module, ids, tokenizer.pad_id, objective, data, length, ends, results, firsts)
        except ConfigError as e:  # the scheme's explicit refusal, not an index error
            results.skipped[length] = str(e)
            print(f"eval.lengths: skipped L={length}: {e}")
    return results


def _score_length_windows(
    module, ids, pad_id: int, objective, data, length: int, ends: list[int], results: LengthResults, firsts=None
) -> None:
    tokens, batch = length + objective.extra_tokens, max(1, data.batch_size * data.seq_len // length)
    ids_l = _budget_prefix(ids, length, objective.extra_tokens, _budget(data))
    firsts_l = None if firsts is None else firsts[: len(ids_l)]
    scores = score_windows(module, EvalWindows(ids_l, tokens, objective, pad_id, firsts=firsts_l), batch)
    results.positions[length], results.losses[length] = scores, scores.loss
    if results.stride:
        sliding = EvalWindows.sliding(ids_l, tokens, results.stride, objective, pad_id, firsts_l)
        results.sliding[length] = score_windows(module, sliding, batch).loss
    if results.keep:
        last = EvalWindows.last_tokens(ids, tokens, ends, results.keep, objective, pad_id, firsts)
        results.last[length] = score_windows(module, last, batch).loss


def _budget(data) -> int | None:
    """The same token budget at every length (data.eval_batches × batch × seq_len when that is set, else the
    whole split), so the numbers compare and long lengths stay affordable."""
    return None if data.eval_batches is None else data.eval_batches * data.batch_size * data.seq_len


def _budget_prefix(ids, length: int, extra: int, budget: int | None):
    """The start of the split that ``budget // length`` non-overlapping windows of ``length`` labels cover
    (at least one): sliding windows then score exactly the tokens the non-overlapping ones do."""
    return ids if budget is None else ids[: max(1, budget // length) * length + extra]


def _sample_ends(n_labels: int, longest: int, budget: int | None) -> list[int]:
    """Ends (exclusive label indices) of the same-targets samples: one every ``longest`` labels, so the
    longest context of each fits in the split and no two samples share a target; at most budget ÷ longest."""
    n = n_labels // longest if budget is None else min(n_labels // longest, max(1, budget // longest))
    return [longest * (j + 1) for j in range(n)]


def score_windows(module, windows, batch_size: int) -> WindowScores:
    """Every scored token's cross-entropy, summed by its position in the window (float64)."""
    loss_sum: Tensor | None = None
    count: Tensor | None = None
    with torch.no_grad():
        for batch in DataLoader(windows, batch_size=batch_size):
            losses, scored, _ = module.token_losses(on_device(batch, module.device))  # (B, T)
            loss_sum = losses.double().sum(0).cpu() + (0 if loss_sum is None else loss_sum)  # (T,)
            count = scored.double().sum(0).cpu() + (0 if count is None else count)
    if loss_sum is None or count is None:
        raise ValueError("score_windows got no windows to score")
    return WindowScores(loss_sum, count)


def length_metrics(results: LengthResults, bytes_per_token: float | None, prefix: str = "") -> dict[str, float]:
    """``val/<prefix>loss_at_<L>`` (and ``val/bpc_at_<L>``, bits per byte, without a prefix, given the
    text's bytes per token), ``..._stride_<S>`` for sliding windows and ``..._last_<K>`` for the same targets."""
    metrics = {
        **{f"val/{prefix}loss_at_{n}": loss for n, loss in results.losses.items()},
        **{f"val/{prefix}loss_at_{n}_stride_{results.stride}": v for n, v in results.sliding.items()},
        **{f"val/{prefix}loss_at_{n}_last_{results.keep}": v for n, v in results.last.items()},
    }
    if bytes_per_token and not prefix:
        metrics.update({f"val/bpc_at_{n}": bits_per_byte(loss, bytes_per_token) for n, loss in results.losses.items()})
    return metrics


def evaluate_task(module, task: ScoredTask, corpus, batch_size: int) -> TaskResults:
    """Exact match of the final model at each ``task.eval_lengths`` entry."""
    results = TaskResults()
    module.eval()
    for length in task.eval_lengths:
        if (blind := blind_baseline(task, length)) is not None:  # what no use of positions can score
            results.blind[length] = blind
        loader = DataLoader(task.length_data(corpus, length), batch_size=batch_size, collate_fn=task.collate)
        try:
            _score_length(module, loader, length, results, getattr(task, "partial_credit", False))
        except ConfigError as e:  # the scheme's explicit refusal (a learned table too short)
            results.skipped[length] = str(e)
            print(f"task.eval_lengths: skipped L={length}: {e}")
    return results


def _score_length(module, loader, length: int, results: TaskResults, strings: bool = False) -> None:
    total, count, right, sequences, tokens_right, found, examples = 0.0, 0, 0, 0, 0, 0.0, []
    with torch.no_grad():
        for batch in loader:
            batch = on_device(batch, module.device)
            losses, scored, logits = module.token_losses(batch)  # (B, T) each; (B, T, V)
            correct = exact_match(logits, batch["labels"])
            total, count = total + float(losses.double().sum()), count + int(scored.sum())
            right, sequences = right + int(correct.sum()), sequences + len(correct)
            tokens_right += int(token_hits(logits, batch["labels"])[0])  # of the scored tokens, which count counts
            found += float(string_hits(logits, batch["labels"]).sum()) if strings else 0.0
            examples += scored_examples(batch, correct)
    results.accuracy[length], results.losses[length] = right / sequences, total / max(count, 1)
    results.token_accuracy[length] = tokens_right / max(count, 1)
    if strings:
        results.strings[length] = found / sequences
    results.examples += examples  # only once the whole length is scored: a refused length leaves none


def scored_examples(batch: dict, correct: torch.Tensor) -> list[ScoredExample]:
    """One per row: its ``length``, exact match, and the task's other integer fields ((B,) each) as extras."""
    ints = {k: v.tolist() for k, v in batch.items() if k not in FORM_FIELDS}
    return [
        ScoredExample(ints["length"][i], right, {k: v[i] for k, v in ints.items() if k != "length"})
        for i, right in enumerate(correct.tolist())
    ]


def task_metrics(results: TaskResults) -> dict[str, float]:
    return {
        **{f"val/acc_at_{n}": acc for n, acc in results.accuracy.items()},
        **{f"val/token_acc_at_{n}": acc for n, acc in results.token_accuracy.items()},
        **{f"val/loss_at_{n}": loss for n, loss in results.losses.items()},
        **{f"val/match_at_{n}": share for n, share in results.strings.items()},
        **{f"val/blind_acc_at_{n}": b.acc for n, b in results.blind.items()},
        **{f"val/blind_token_acc_at_{n}": b.token_acc for n, b in results.blind.items()},
    }


def evaluate_parts(module, task, corpus, batch_size: int) -> tuple[dict[str, float], str]:
    """A mixture's parts (harness/data/tasks/mixture.py), each scored on its own evaluation sets as if it had
    trained alone: ``val/<part>/acc`` and ``val/<part>/token_acc`` at the training lengths, and every
    ``task_metrics`` entry per length as ``val/<part>/…``; with their accuracy tables. Nothing for other tasks."""
    metrics, tables = {}, []
    for name, part in getattr(task, "parts", {}).items():
        results = evaluate_task(module, part, corpus, batch_size)
        metrics.update({key.replace("val/", f"val/{name}/", 1): v for key, v in task_metrics(results).items()})
        trained = TaskResults()  # lengths drawn from train_lengths, as val/acc: key 0 stands for them
        _score_length(
            module,
            DataLoader(part.validation_data(corpus, 0), batch_size=batch_size, collate_fn=part.collate),
            0,
            trained,
        )
        metrics[f"val/{name}/acc"], metrics[f"val/{name}/token_acc"] = trained.accuracy[0], trained.token_accuracy[0]
        tables.append(
            f"{name} (training lengths: per token {trained.token_accuracy[0]:.3f}, exact match "
            f"{trained.accuracy[0]:.3f}): " + accuracy_table(results)
        )
    return metrics, "\n".join(tables)


def accuracy_table(results: TaskResults) -> str:
    """The final model's accuracies per length, each beside its position-blind baseline [in brackets]."""
    baseline = " [position-blind baseline, harness/data/tasks/blind.py]" if results.blind else ""
    lines = ["task accuracy by length" + baseline]
    for n in sorted({*results.accuracy, *results.skipped}):
        if n in results.skipped:
            lines.append(f"  L={n:<5} skipped: {results.skipped[n]}")
            continue
        b = results.blind.get(n)
        token = f"{results.token_accuracy[n]:.3f}" + (f" [{b.token_acc:.3f}]" if b else "")
        exact = f"{results.accuracy[n]:.3f}" + (f" [{b.acc:.3f}]" if b else "")
        lines.append(f"  L={n:<5} per token {token:<15} exact match {exact}")
    return "\n".join(lines)
