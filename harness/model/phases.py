"""Positional phases: a run whose positional configuration changes at stated steps (``phases``, conf/config.yaml).

What current training recipes do: DroPE (Sakana AI 2025, "Extending the Context of Pretrained LLMs by Dropping
their Positional Embeddings", arXiv:2512.12167) trains with RoPE, drops it, and recalibrates briefly at the
original length; Qwen2.5-1M raises RoPE's base during training (ABF); modded-nanogpt applies YaRN while training.

A phase begins at optimizer step ``at`` (the first step it trains is step ``at`` + 1) and lasts to the next one:
  pos      a scheme from here on: an option name, or one with settings of its own (``rope(base=500000)``), built
           like a pos.layers entry (harness/config/values.py); the model's weights carry on
  scaling  a length scaling of the scheme applied in training from here, at ``factor`` (the lengths it is scaled
           for are factor × the training length), and in validation too: validation scores the model as trained
  seq_len  training batches cut to their first seq_len tokens from here (≤ data.seq_len; validation keeps the
           whole windows)
A key a phase leaves out keeps the previous phase's value (a new pos drops the scaling). The phase of a step is
a function of the list and the step alone, so a run resumed from any checkpoint trains every step in its own
phase; only schemes without trained parameters take part, so a checkpoint's keys are the same in every phase.
Every training step logs ``train/phase`` (0: the config's own), so the boundaries show in MLflow.

Notation: B batch, T sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import lightning as L

from positional.base import PositionalScheme, Shape


@dataclass(frozen=True)
class Phase:
    at: int  # the optimizer step it begins at
    label: str  # what it sets, e.g. "pos=none" or "pos=rope(base=500000) seq_len=64"
    pos: Callable[[Shape], PositionalScheme] | None = None
    scaling: str | None = None
    factor: float | None = None
    seq_len: int | None = None


@dataclass(frozen=True)
class PhaseState:
    """What is in force at a step: the phase index (-1: the config's own), the phase whose scheme is used (-1:
    the config's), a training-time scaling (method, factor) and the training length cut."""

    index: int
    pos_from: int
    scaling: tuple[str, float] | None
    seq_len: int | None


def state_at(phases: list[Phase], step: int) -> PhaseState:
    index = max((i for i, p in enumerate(phases) if p.at <= step), default=-1)
    pos_from, scaling, seq_len = -1, None, None
    for i, p in enumerate(phases[: index + 1]):
        if p.pos is not None:
            pos_from, scaling = i, None
        if p.scaling is not None:
            scaling = (p.scaling, float(p.factor or 1.0))
        if p.seq_len is not None:
            seq_len = p.seq_len
    return PhaseState(index, pos_from, scaling, seq_len)


def describe(phases: list[Phase], own: str) -> str:
    """``0: pos=rope · 300: pos=none``: the run's tag."""
    return " · ".join([f"0: pos={own}", *(f"{p.at}: {p.label}" for p in phases)])


class PositionPhases(L.Callback):
    """Applies the phase of each training step before its forward: swaps ``model.pos``, enters a training-time
    scaling, cuts the batch to the phase's length."""

    def __init__(self, phases: list[Phase]):
        self.phases = phases
        self.state: PhaseState | None = None
        self._own: PositionalScheme | None = None  # the config's scheme, kept to return to
        self._built: dict[int, PositionalScheme] = {}
        self._scaled = ExitStack()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        state = state_at(self.phases, trainer.global_step)
        if state != self.state:
            if self.state is not None or state.index >= 0:
                phase = self.phases[state.index].label if state.index >= 0 else "the config's own"
                print(f"phase {state.index + 1} from step {module.global_step}: {phase}", flush=True)
            self._enter(module, state)
        module.log("train/phase", float(state.index + 1))
        if state.seq_len is not None:
            for key in ("input_ids", "labels", "key_padding_mask", "document_ids"):
                if batch.get(key) is not None:
                    batch[key] = batch[key][:, : state.seq_len]  # (B, T) -> (B, seq_len)

    def on_train_end(self, trainer, module):
        self._scaled.close()  # the final evaluation applies its own scalings (eval.scalings) to the scheme as trained
        module.scaled_in_training = False

    def on_validation_start(self, trainer, module):
        if trainer.state.fn == "validate":  # after fit (harness/train.py): scored as in fit, in the last step's phase
            self._enter(module, state_at(self.phases, max(trainer.global_step - 1, 0)))

    def on_validation_end(self, trainer, module):
        if trainer.state.fn == "validate":
            self.on_train_end(trainer, module)

    def _enter(self, module, state: PhaseState) -> None:
        self._scaled.close()
        self._own = self._own or module.model.pos
        scheme = self._own if state.pos_from < 0 else self._scheme(state.pos_from, module)
        module.model.pos = scheme
        module.scaled_in_training = state.scaling is not None
        if state.scaling is not None:
            method, factor = state.scaling  # the closed stack takes the new phase's scaling
            self._scaled.enter_context(scheme.rescaled(method, round(factor * scheme.shape.max_len), in_training=True))
        self.state = state

    def _scheme(self, index: int, module) -> PositionalScheme:
        if index not in self._built:
            build = self.phases[index].pos
            assert build is not None and self._own is not None
            self._built[index] = build(self._own.shape).to(module.device)
        return self._built[index]
