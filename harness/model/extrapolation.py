"""Length extrapolation as the papers measure it (docs/length-extrapolation.md).

One trained model, scored at every ``eval.lengths`` entry under
  - the configured scheme (``val/loss_at_<L>``),
  - each ``eval.scalings`` entry, swapped in by the scheme's ``rescaled`` context manager, no retraining
    (``val/<scaling>/loss_at_<L>``; s = L / training length unless pos.scaling.factor is set),
  - each scaling again after ``eval.finetune_steps`` steps of training at ``eval.finetune_length`` with that
    scaling applied, from the same trained weights each time (``val/finetuned/<scaling>/loss_at_<L>``; s fixed
    at finetune_length / training length, as position interpolation and YaRN evaluate their fine-tuned models),
with non-overlapping windows, sliding ones (``eval.stride``: ``..._stride_<S>``) and the same final K tokens at
every length (``eval.same_targets``: ``..._last_<K>``). Artifacts: ``loss_by_position.csv`` / ``.png`` (the
non-overlapping windows' loss in ``eval.position_buckets`` buckets of position), with scalings
``loss_vs_length_by_scaling.png``, with a fine-tune ``finetune_loss.csv`` (its training loss per step).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader

from harness.data.loaders import on_device
from harness.model.diagnostics import png
from harness.model.evaluate import LengthResults, WindowScores, evaluate_lengths, length_metrics
from harness.model.loss import summed_loss


@dataclass(frozen=True)
class Bucket:
    start: int  # first position in the window (0-based)
    end: int  # one past the last
    tokens: int  # scored tokens in it
    loss: float  # nats per scored token (nan where none was scored)


def bucket_losses(scores: WindowScores, n_buckets: int) -> list[Bucket]:
    """Loss by position: positions 0 … T−1 in min(n_buckets, T) buckets of (nearly) equal width, each the
    token-weighted mean of its positions; weighted by ``tokens`` the buckets average to the window loss."""
    t = scores.loss_sum.numel()
    edges = [b * t // min(n_buckets, t) for b in range(min(n_buckets, t) + 1)]
    sums = [  # (start, end, scored tokens, summed loss)
        (lo, hi, float(scores.count[lo:hi].sum()), float(scores.loss_sum[lo:hi].sum()))
        for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]
    return [Bucket(lo, hi, int(n), loss / n if n else float("nan")) for lo, hi, n, loss in sums]


@dataclass
class Extrapolation:
    """Results by condition: "" (as configured), "<scaling>/", "finetuned/<scaling>/"."""

    conditions: dict[str, LengthResults] = field(default_factory=dict)
    finetune_losses: dict[str, list[float]] = field(default_factory=dict)  # training loss per fine-tune step

    @property
    def skipped(self) -> dict[int, str]:
        return self.conditions[""].skipped

    def metrics(self, bytes_per_token: float | None) -> dict[str, float]:
        return {
            key: value
            for prefix, results in self.conditions.items()
            for key, value in length_metrics(results, bytes_per_token, prefix).items()
        }

    def files(self, n_buckets: int) -> dict[str, bytes]:
        rows = [
            (prefix.rstrip("/") or "configured", length, b)
            for prefix, results in self.conditions.items()
            for length, scores in results.positions.items()
            for b in bucket_losses(scores, n_buckets)
        ]
        csv = "condition,length,start,end,tokens,loss\n" + "".join(
            f"{c},{n},{b.start},{b.end},{b.tokens},{b.loss:.6f}\n" for c, n, b in rows
        )
        files = {"loss_by_position.csv": csv.encode()}
        if rows:  # every length skipped (eval_skipped_at_<L>): nothing to draw
            files["loss_by_position.png"] = _by_position_png(rows)
        if rows and len(self.conditions) > 1:
            files["loss_vs_length_by_scaling.png"] = _by_length_png(self.conditions)
        if self.finetune_losses:  # the fine-tune's own training curve, per scaling
            files["finetune_loss.csv"] = (
                "scaling,step,loss\n"
                + "".join(
                    f"{m},{i + 1},{v:.6f}\n" for m, losses in self.finetune_losses.items() for i, v in enumerate(losses)
                )
            ).encode()
        return files


def evaluate_extrapolation(
    module, corpus, tokenizer, objective, data, settings, seed: int, world_size: int = 1
) -> Extrapolation:
    """Every condition of the module docstring; ``settings``: the EvalSettings (``eval``); ``world_size``: the DDP
    ranks whose global batch the fine-tune (on this rank alone) takes a step over."""
    pos, out = module.model.pos, Extrapolation()

    def score(context) -> LengthResults:  # context(length): what applies while scoring at that length
        lengths = list(settings.lengths)  # one call: the same-targets samples end where the longest length puts them
        return evaluate_lengths(
            module, corpus, tokenizer, objective, data, lengths, settings.stride, settings.same_targets, context
        )

    out.conditions[""] = score(lambda length: nullcontext())
    for method in settings.scalings:
        out.conditions[f"{method}/"] = score(lambda length, m=method: pos.rescaled(m, length))
    if settings.finetune_steps:
        trained = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
        for method in settings.scalings:
            with pos.rescaled(method, settings.tune_length, in_training=True):
                out.finetune_losses[method] = finetune(
                    module, corpus, objective, data, settings, settings.tune_length, seed, world_size
                )
            out.conditions[f"finetuned/{method}/"] = score(
                lambda length, m=method: pos.rescaled(m, settings.tune_length)
            )
            module.model.load_state_dict(trained)  # every scaling fine-tunes the same trained weights
    return out


def finetune(module, corpus, objective, data, settings, length: int, seed: int, world_size: int = 1) -> list[float]:
    """``settings.finetune_steps`` AdamW steps (constant lr ``finetune_lr``, gradients clipped at 1) on fresh
    training windows of ``length`` tokens, as many tokens per step as training's global batch: a step takes
    ``world_size`` per-device batches one after another and averages their mean losses, as DDP's training step
    averages its ranks'. Returns each step's loss."""
    torch.manual_seed(seed)
    batch_size = max(1, data.batch_size * data.seq_len // length)
    windows = objective.training_data(corpus, length, settings.finetune_steps * batch_size * world_size, seed + 1_000)
    optimizer = torch.optim.AdamW(module.model.parameters(), lr=settings.finetune_lr)
    losses, step_losses = [], []
    module.train()
    optimizer.zero_grad(set_to_none=True)
    for batch in DataLoader(windows, batch_size=batch_size):
        loss_sum, n = summed_loss(module.model, on_device(batch, module.device))  # model.loss_chunk's chunks, if set
        loss = loss_sum / n.clamp(min=1)
        (loss / world_size).backward()
        step_losses.append(float(loss.detach()))
        if len(step_losses) < world_size:
            continue
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(sum(step_losses) / world_size)
        step_losses = []
    module.eval()
    return losses


def _by_length_png(conditions: dict[str, LengthResults]) -> bytes:
    """Loss vs eval length, one line per condition (dashed: sliding windows)."""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for prefix, results in conditions.items():
        name = prefix.rstrip("/") or "configured"
        lengths = sorted(results.losses)
        line = ax.plot(lengths, [results.losses[n] for n in lengths], marker="o", label=name)[0]
        if results.sliding:
            slid = sorted(results.sliding)
            ax.plot(
                slid,
                [results.sliding[n] for n in slid],
                ls="--",
                color=line.get_color(),
                label=f"{name}, stride {results.stride}",
            )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="evaluation length (tokens)",
        ylabel="val loss (nats/token)",
        title="One trained model under each length scaling",
    )
    ax.legend(fontsize=7)
    return png(fig)


def _by_position_png(rows: list[tuple[str, int, Bucket]]) -> bytes:
    """One panel per condition: loss by position bucket, one line per eval length."""
    names = list(dict.fromkeys(c for c, _, _ in rows))
    fig = Figure(figsize=(5.0 * min(len(names), 3), 3.6 * ((len(names) + 2) // 3)), layout="constrained")
    axes = fig.subplots((len(names) + 2) // 3, min(len(names), 3), squeeze=False).flatten()
    for ax, name in zip(axes, names, strict=False):
        for length in sorted({n for c, n, _ in rows if c == name}):
            buckets = [b for c, n, b in rows if c == name and n == length]
            ax.plot(
                [(b.start + b.end) / 2 for b in buckets], [b.loss for b in buckets], marker=".", label=f"L={length}"
            )
        ax.set(title=name, xlabel="position in window (bucket centre)", ylabel="val loss (nats/token)")
        ax.legend(fontsize=7)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    return png(fig)
