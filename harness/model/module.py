"""The LightningModule: loss, validation, optimizer and schedule. Receives a built model.

Validation scores each example twice, as written and with its token order permuted inside the window
(harness/data/loaders.py): ``val/loss``, ``val/loss_shuffled`` and ``val/order_gain`` = their
difference, in nats per scored token — how much the model uses word order. A task scored
per sequence (the synthetic tasks) also logs ``val/acc``, the exact-match accuracy, and
``val/token_acc``, the per-token accuracy over answer tokens. Text logs ``val/bpc``, bits per byte of the
text the tokens cover (nats/token × tokens/byte ÷ ln 2), comparable across tokenizers. The last validation's
loss per window (``val_windows``) goes to the run as an artifact: every run scores the same windows, so a report
can tell the spread between seeds from the finite validation sample's (results/spread.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import lightning as L
import torch
import torch.nn.functional as F

from harness.data.loaders import without_full_masks
from harness.data.objectives import IGNORE
from harness.data.tasks import exact_match, token_hits
from harness.errors import Diverged
from harness.model.loss import summed_cross_entropy, summed_loss
from harness.model.schedule import Schedule, parameter_groups

if TYPE_CHECKING:  # the model it trains; imported for the annotation only
    from harness.model.transformer import Transformer


class LanguageModel(L.LightningModule):
    def __init__(
        self,
        model: Transformer,
        optimizer: Callable,
        schedule: Schedule,
        bytes_per_token: float | None,
        scores_sequences: bool = False,
    ):
        """``bytes_per_token``: bytes of validation text per token (harness/data/tokenizer.py), turning
        nats/token into bits/byte (``val/bpc``); None: no bits/byte (a synthetic task's answers are no text)."""
        super().__init__()
        self.model, self.make_optimizer, self.schedule = model, optimizer, schedule
        self.bytes_per_token, self.scores_sequences = bytes_per_token, scores_sequences
        self.val_results: list[dict] = []  # one entry per evaluation, read by the summary
        self.val_windows = torch.zeros(0, 2, dtype=torch.float64)  # the last evaluation's, per window (below)
        self.scaled_in_training = False  # a phase trains with a length scaling (harness/model/phases.py)
        self._step_losses: tuple[int, list[torch.Tensor]] = (-1, [])  # (global_step, its micro-batches' losses)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        return without_full_masks(batch)  # on the host, so the forward reads no value (harness/data/loaders.py)

    def on_train_batch_start(self, batch, batch_idx: int):
        self.model.before_training_step(self.global_step)  # Performer's redraw, decided on the host

    def token_losses(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(each token's cross-entropy, 0 where nothing is scored; which tokens are scored), (B, T) each; the logits."""
        logits = self.model(batch["input_ids"], batch["key_padding_mask"], batch.get("document_ids"))  # (B, T, V)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, float64 kept
        losses = F.cross_entropy(wide.transpose(1, 2), batch["labels"], ignore_index=IGNORE, reduction="none")
        return losses, batch["labels"] != IGNORE, logits  # (B, V, T) in, (B, T) out

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss_sum, n = summed_loss(self.model, batch)
        # Masked tokens per rank differ (MLM masks ~15 % at random), so each rank's own token-mean,
        # averaged by DDP, is not the global batch's token-mean. Dividing by the global count × world
        # size makes DDP's gradient average exactly the single-process gradient at the same global
        # batch. On one device reduce() is the identity and this is loss_sum / n.
        global_sum, global_n = self.trainer.strategy.reduce(
            torch.stack([loss_sum.detach().float(), n.float()]), reduce_op="sum"
        )
        loss = loss_sum * self.trainer.world_size / global_n
        mean = global_sum / global_n  # the same on every rank, so all stop together on NaN
        if not torch.isfinite(mean):
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            raise Diverged(
                f"training diverged: the loss is {mean.item()} at step {self.global_step} (lr then "
                f"{lr:.3g}); lower optim.optimizer.lr, lengthen optim.schedule.warmup_steps or clip "
                "gradients with trainer.gradient_clip_val"
            )
        if self._step_losses[0] != self.global_step:  # the first micro-batch of an optimizer step
            self._step_losses = (self.global_step, [])
        self._step_losses[1].append(mean)
        # the loss the step's gradient is of: Lightning averages micro-batches, and writes the last value logged
        self.log("train/loss", torch.stack(self._step_losses[1]).mean(), prog_bar=True)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        # the steps Lightning writes its rows at (its logger connector: batches stepped + 1); else 9 late
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:  # type: ignore[attr-defined]  # undeclared
            self.log_dict(self.model.diagnostics())
        return loss

    def on_validation_epoch_start(self):
        # summed loss, scored tokens, shuffled summed loss, shuffled tokens, right sequences, sequences,
        # right scored tokens
        self._val = torch.zeros(7, dtype=torch.float64, device=self.device)
        self._windows: list[torch.Tensor] = []  # (B, 2) per batch: each window's summed loss and scored tokens
        # validation scores the model as trained: a configured length scaling (pos.scaling, RoPE's) is for the
        # final evaluation's lengths, and at factor > 1 it would change val/loss at the training length too
        self._unscaled = contextlib.ExitStack()  # (a phase that trains with a scaling is validated with it)
        if "none" in self.model.pos.length_scalings and not self.scaled_in_training:
            self._unscaled.enter_context(self.model.pos.rescaled("none", 1))

    def _window_losses(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(each window's summed cross-entropy, float64, and scored tokens, (B,) each; the logits, or None under
        ``model.loss_chunk`` on text, whose windows are scored one at a time without them)."""
        labels, chunk = batch["labels"], self.model.cfg.loss_chunk
        if chunk is None or self.scores_sequences:
            losses, scored, logits = self.token_losses(batch)
            return losses.double().sum(1), scored.sum(1), logits
        h = self.model(batch["input_ids"], batch["key_padding_mask"], batch.get("document_ids"), decode=False)
        head = self.model.output_layer()
        sums = [summed_cross_entropy(h[b], *head, labels[b], chunk, IGNORE).double() for b in range(len(h))]
        return torch.stack(sums), (labels != IGNORE).sum(1), None

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        labels = batch["plain"]["labels"]
        counts: tuple[torch.Tensor | int, ...] = (0, 0, 0)  # right sequences, sequences, right scored tokens
        sums, tokens, logits = self._window_losses(batch["plain"])
        self._windows.append(torch.stack([sums, tokens.double()], 1))
        if self.scores_sequences:  # exact match needs the logits
            assert logits is not None
            counts = (exact_match(logits, labels).sum(), len(labels), token_hits(logits, labels)[0])
        shuffled_sum, shuffled_n = summed_loss(self.model, batch["shuffled"])
        self._val += torch.stack(
            [
                sums.sum().double(),
                tokens.sum().double(),
                shuffled_sum.double(),
                shuffled_n.double(),
                *(torch.as_tensor(x, dtype=torch.float64, device=self.device) for x in counts),
            ]
        )

    def on_validation_epoch_end(self):
        self._unscaled.close()
        total, n, shuffled, shuffled_n, right, sequences, tokens_right = self.trainer.strategy.reduce(
            self._val, reduce_op="sum"
        ).tolist()
        windows = self._gathered_windows()
        loss = total / n  # nats per predicted token, weighted by tokens, not batches
        metrics = {
            "val/loss": loss,
            "val/loss_shuffled": shuffled / shuffled_n,
            "val/order_gain": shuffled / shuffled_n - loss,
        }
        if self.bytes_per_token:
            metrics["val/bpc"] = bits_per_byte(loss, self.bytes_per_token)
        if self.scores_sequences:  # exact match per sequence, and per answer token (Ruoss et al. 2023)
            metrics["val/acc"], metrics["val/token_acc"] = right / sequences, tokens_right / n
        self.log_dict(metrics, prog_bar=True)
        if not self.trainer.sanity_checking:
            self.val_results.append({"step": self.global_step, **metrics})
            self.val_windows = windows

    def _gathered_windows(self) -> torch.Tensor:
        """Every validation window's (summed loss, scored tokens), (N, 2) float64 on the host, in the validation
        set's order: with DDP rank r scored windows r, r + W, r + 2W, … (UnrepeatedDistributedSampler), so the
        ranks' rows, padded to one length, interleave back."""
        local = torch.cat(self._windows) if self._windows else torch.zeros(0, 2, dtype=torch.float64)
        if self.trainer.world_size == 1:
            return local.cpu()
        longest = int(
            self.trainer.strategy.reduce(torch.tensor(float(len(local)), device=self.device), reduce_op="max")
        )
        padded = torch.full((longest, 2), math.nan, dtype=torch.float64, device=self.device)
        padded[: len(local)] = local
        rows = self.trainer.strategy.all_gather(padded).transpose(0, 1).reshape(-1, 2)  # (W, longest, 2) → window order
        return rows[~rows[:, 0].isnan()].cpu()

    def configure_optimizers(self):
        optimizer = self.make_optimizer(parameter_groups(self.model))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, partial(self.schedule.factor, total_steps=self.trainer.max_steps)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
    """nats/token → bits/byte: × tokens/byte ÷ ln 2 (the byte tokenizer: one token per byte, so ÷ ln 2), so
    tokenizers with different vocabularies compare on the same text."""
    return nats_per_token / (bytes_per_token * math.log(2))


class Throughput(L.Callback):
    """train/tokens_per_s: input tokens ÷ time inside training steps (forward, backward,
    optimizer), so validation and logging pauses do not count against it. The first step of the process
    (allocator and thread-pool warm-up; a resumed run's too) is left out of the logged windows and the run mean
    alike."""

    def __init__(self, every: int = 10):
        self.every, self.tokens, self.seconds = every, 0, 0.0
        self.total_tokens, self.total_seconds = 0, 0.0
        self._first: int | None = None  # the global_step this process started training at (> 0: resumed)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._first = trainer.global_step if self._first is None else self._first
        self._step = trainer.global_step  # the optimizer step this (micro-)batch is part of, counted from 0
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        dt = time.perf_counter() - self._t0
        assert self._first is not None, "on_train_batch_start ran first"
        if self._step == self._first and trainer.max_steps > self._first + 1:
            return  # this process's warm-up step, each of its micro-batches
        n = batch["input_ids"].numel() * trainer.world_size
        self.tokens, self.seconds = self.tokens + n, self.seconds + dt
        self.total_tokens, self.total_seconds = self.total_tokens + n, self.total_seconds + dt
        if trainer.global_step != self._step and trainer.global_step % self.every == 0:  # a step's last micro-batch
            module.log("train/tokens_per_s", self.tokens / self.seconds)
            self.tokens, self.seconds = 0, 0.0

    @property
    def mean(self) -> float | None:
        """None: this process trained no step (resumed at trainer.max_steps)."""
        return self.total_tokens / max(self.total_seconds, 1e-9) if self.total_tokens else None
