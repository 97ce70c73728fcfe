"""Objects from a checked config: the model, the data loaders, the LightningModule, the Trainer.

Everything here runs after ``harness.config.validate``: a ConfigError raised now is a value no
schema could judge without building (a learned table asked for a longer sequence, a corpus that is
not UTF-8), and keeps its one-line message through Hydra's instantiate.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L

from harness.config.instantiate import instantiate
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
    train_loader: object  # torch DataLoader
    val_loader: object
    geometry: BatchGeometry

    @property
    def owner(self) -> bool:
        return self.trainer.is_global_zero


def build(checked, corpus, first_step: int, logger, callbacks: list) -> Built:
    """Seed, then model → Trainer (its world size sizes the data, its rank decides who logs) → loaders."""
    cfg, data, task = checked.cfg, checked.data, checked.task
    L.seed_everything(checked.seed, verbose=False)
    model = checked.deferred.materialize()  # the validation's construction, made real (harness/config/deferred.py)
    if checked.model.compile:
        model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    trainer = instantiate(cfg.trainer, logger=logger, callbacks=callbacks)
    geometry = BatchGeometry.of(trainer, data.batch_size, cfg.optim.optimizer.lr)
    train_dl, val_dl = make_loaders(corpus, task, data.seq_len, data.batch_size,
                                    n_train=geometry.train_examples(checked.trainer.max_steps), seed=checked.seed,
                                    eval_batches=data.eval_batches, world_size=geometry.world_size,
                                    rank=trainer.global_rank, start=first_step * geometry.effective_batch,
                                    num_workers=data.num_workers)
    per_token = None if task.scores_sequences else bytes_per_token(corpus, checked.tokenizer)  # → bits/byte
    module = LanguageModel(model, checked.optimizer, checked.schedule,
                           bytes_per_token=per_token, scores_sequences=task.scores_sequences)
    return Built(model, module, trainer, train_dl, val_dl, geometry)
