"""Objects from a checked spec: the model, the data loaders, the LightningModule, the Trainer.

The model is constructed here once, directly, right after the seed: its initial weights are the ones every
committed result was trained from. ``check`` built it on meta for the checks; nothing of that construction is
reused. A ConfigError raised now is a value no check could judge without real data (a corpus that is not UTF-8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from harness.config.check import Checked
from harness.config.resources import model_of
from harness.config.spec import TrainerSettings
from harness.data.corpus import Corpus
from harness.data.loaders import make_loaders
from harness.data.tokenizer import bytes_per_token
from harness.model.module import LanguageModel
from harness.model.transformer import Transformer
from harness.scaleout import BatchGeometry


@dataclass
class Built:
    """What a run trains with; ``owner`` is global rank 0 (the one that writes the run record)."""

    model: Transformer
    module: LanguageModel
    trainer: L.Trainer
    train_loader: DataLoader
    val_loader: DataLoader
    geometry: BatchGeometry

    @property
    def owner(self) -> bool:
        return self.trainer.is_global_zero


def build(checked: Checked, corpus: Corpus, first_step: int, logger: Logger, callbacks: Sequence[Callback]) -> Built:
    """Seed, then model → Trainer (its world size sizes the data, its rank decides who logs) → loaders."""
    spec, task, data = checked.spec, checked.task, checked.spec.data
    L.seed_everything(spec.seed, verbose=False)
    model = model_of(spec, checked.tokenizer.vocab_size, task.sequence_tokens(data.seq_len), task.causal)
    if spec.model.compile:
        model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    trainer = trainer_of(spec.trainer, logger, callbacks)
    lr = spec.optimizer.kwargs.get("lr")  # for the effective rate it reports; 0 for an optimizer without one
    geometry = BatchGeometry(
        data.batch_size,
        trainer.accumulate_grad_batches,
        trainer.world_size,
        float(lr) if isinstance(lr, (int, float)) else 0.0,
    )
    train_dl, val_dl = make_loaders(
        corpus,
        task,
        data.seq_len,
        data.batch_size,
        # every rank's windows for max_steps steps (the sampler splits them over ranks): fewer would wrap into an epoch
        n_train=spec.trainer.max_steps * geometry.effective_batch,
        seed=spec.seed,
        eval_batches=data.eval_batches,
        world_size=geometry.world_size,
        rank=trainer.global_rank,
        start=first_step * geometry.effective_batch,
        num_workers=data.num_workers,
    )
    windows = None if data.eval_batches is None else data.eval_batches * data.batch_size * geometry.world_size
    per_token = (  # → bits/byte, of the text the validation windows (consecutive, seq_len tokens each) cover
        None
        if task.scores_sequences
        else bytes_per_token(corpus, checked.tokenizer, windows and windows * data.seq_len)
    )
    module = LanguageModel(
        model,
        spec.optimizer.factory(),
        spec.schedule.build(),
        bytes_per_token=per_token,
        scores_sequences=task.scores_sequences,
    )
    return Built(model, module, trainer, train_dl, val_dl, geometry)


def trainer_of(t: TrainerSettings, logger: Logger, callbacks: Sequence[Callback]) -> L.Trainer:
    # val_check_interval counts optimizer steps (a fraction: of the epoch, max_steps, which Lightning takes only per
    # epoch); Lightning's counts batches
    every = (
        t.val_check_interval
        if isinstance(t.val_check_interval, int)
        else max(1, int(t.val_check_interval * t.max_steps))
    )
    return L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        max_steps=t.max_steps,
        val_check_interval=every * t.accumulate_grad_batches,
        check_val_every_n_epoch=t.check_val_every_n_epoch,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.gradient_clip_val,
        accumulate_grad_batches=t.accumulate_grad_batches,
        precision=t.precision,
        num_sanity_val_steps=t.num_sanity_val_steps,
        enable_checkpointing=t.enable_checkpointing,
        enable_model_summary=t.enable_model_summary,
        enable_progress_bar=t.enable_progress_bar,
        strategy=t.strategy,
        num_nodes=t.num_nodes,
        logger=logger,
        callbacks=list(callbacks),
        **t.extra,
    )
