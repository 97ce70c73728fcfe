"""Section 1 of the GPU check (``python -m harness.bench.gpu``): ``--check --gpu-memory``'s estimate beside
the peak a GPU measures.

The estimate is computed as ``validate`` computes it (``resources.gpu_estimates``: the model laid out on the
meta device, its scheme's terms); the peak is ``torch.cuda.max_memory_allocated`` over ``steps`` optimizer
steps trained as harness.model.module trains (bf16 autocast, the preset's AdamW with no decay on biases and
norms, fp32 cross-entropy over every position's logits, ``model.loss_chunk`` of them at a time where a cell sets
it), on random token ids at the paper's vocabulary size (memory does not depend on the text). A test holds the
estimate equal to the figure ``--check`` prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from harness.bench.internals import compose_cell, composed_model
from harness.bench.measure import trim
from harness.config.resources import gpu_estimates
from harness.model.loss import summed_loss
from harness.model.schedule import parameter_groups
from harness.model.transformer import Transformer


@dataclass(frozen=True)
class MemoryCell:
    preset: str
    pos: str
    causal: bool
    vocab: int
    batches: tuple[int, ...]
    extra: tuple[str, ...] = ()  # more overrides (the tests' small shapes)

    def overrides(self, batch: int) -> list[str]:
        return [f"experiment={self.preset}", "scale=paper", f"pos={self.pos}", f"data.batch_size={batch}", *self.extra]


# the whole step's logits, as the committed H200 rows measured them (the presets now set model.loss_chunk=8192)
WHOLE = ("model.loss_chunk=null",)
MEMORY_CELLS = (
    MemoryCell("eleuther_rotary", "rope", True, 50257, (8, 16, 24, 32), WHOLE),  # GPT-2's BPE
    MemoryCell("roformer_mlm", "rope", False, 30522, (32, 64, 128), WHOLE),  # BERT's WordPiece
)


@dataclass
class MemoryRow:
    preset: str
    pos: str
    batch: int
    seq_len: int
    vocab: int
    n_params: int
    estimate_gib: float
    states_gib: float
    activations_gib: float
    logits_gib: float
    measured_gib: float = float("nan")
    measured_over_estimate: float = float("nan")
    tokens_per_s: float = float("nan")
    status: str = "ok"


def estimate(cell: MemoryCell, batch: int):
    """(config, the estimate ``--check --gpu-memory`` prints, parameters): the model laid out on the meta device
    and the estimate computed as ``validate`` computes it for a softmax cell."""
    cfg = compose_cell(cell.overrides(batch))
    model = composed_model(cfg, cell.vocab, cell.causal, "meta")
    return cfg, gpu_estimates(cfg, cell.vocab, cfg.data.seq_len, model.num_params(), model.pos)[0], model.num_params()


def memory_row(cell: MemoryCell, batch: int, device: str, steps: int) -> MemoryRow:
    """The estimate ``--check --gpu-memory`` prints for this cell, and the measured peak of ``steps`` steps."""
    cfg, est, n_params = estimate(cell, batch)
    t = cfg.data.seq_len
    row = MemoryRow(
        cell.preset,
        cell.pos,
        batch,
        t,
        cell.vocab,
        n_params,
        est.total / 2**30,
        est.states / 2**30,
        est.activations / 2**30,
        est.logits / 2**30,
    )
    trim(device)
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    try:
        seconds = _train(cfg, batch, t, cell, device, steps)
        if device == "cuda":
            row.measured_gib = (torch.cuda.max_memory_allocated() - base) / 2**30
            row.measured_over_estimate = row.measured_gib / row.estimate_gib
        row.tokens_per_s = batch * t * (steps - 1) / seconds
    except torch.OutOfMemoryError:
        row.status = "out of memory"
        if device == "cuda":
            row.measured_gib = torch.cuda.max_memory_allocated() / 2**30  # the peak reached before it failed
    trim(device)
    return row


def _train(cfg, batch: int, t: int, cell: MemoryCell, device: str, steps: int) -> float:
    """The cell's model built on ``device`` and trained by ``train_steps`` (bf16 autocast on CUDA); the seconds of
    all but the first step. Built here, the model is freed before ``trim`` whether the steps end or run out of
    memory."""
    model = composed_model(cfg, cell.vocab, cell.causal, device).train()
    ids = torch.randint(cell.vocab, (batch, t), device=device)
    labels = ids.roll(-1, dims=1) if cell.causal else torch.where(torch.rand(batch, t, device=device) < 0.15, ids, -100)
    return train_steps(cfg, model, ids, labels, steps, bf16=device == "cuda")


def train_steps(cfg, model: Transformer, ids: torch.Tensor, labels: torch.Tensor, steps: int, bf16: bool) -> float:
    """``steps`` optimizer steps as harness.model.module trains (the spec's AdamW over its ``parameter_groups``, no
    decay on biases and norms; its ``summed_loss``, fp32 cross-entropy over every logit; bf16 autocast when
    ``bf16``); the seconds of all but the first."""
    device = ids.device.type
    optimizer = cfg.optimizer.build(parameter_groups(model))
    batch = {"input_ids": ids, "key_padding_mask": None, "labels": labels}
    started = 0.0
    for i in range(steps):
        if i == 1:
            _sync(device)
            started = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            total, n = summed_loss(model, batch)
        (total / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return time.perf_counter() - started


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
