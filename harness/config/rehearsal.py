"""Will it fit? One training step and each evaluation, rehearsed on torch's ``meta`` device, measured
tensor by tensor.

resources.py's estimate is a formula over the model's width and depth: it cannot know what a scheme or
a variant makes large (FIRE's MLP over every query-key pair, ``pos.max_position`` positions drawn from
a permutation, a Performer's feature matrix). So the checks run the real code instead, on
tensors that have a shape and no storage: the model built on ``meta`` (its parameters and buffers),
then a forward and backward over one training batch, a fine-tune step at ``eval.finetune_length``, and
a forward at every evaluation length, each under ``Ledger``, which adds up the bytes of every storage an
op makes while Python holds it (SDPA takes the kernel the CPU would take: ``FusedAttention``). The peak
of a phase, plus the weights and AdamW's two moments (gradients are made by the step, so counted in it),
is what the phase needs; more than this machine has is refused, and the message names the key that
made it large: the config value among the dimensions of the largest tensor (an evaluation length is
named by the key that lists it). The ledger counts the FLOPs of matrix products and attention kernels
too: a phase that would compute for more than ``STEP_HOURS`` even at ``FAST_CPU_RATE`` is refused, the same on an
idle machine and a busy one.

Nothing is allocated and no kernel runs, so a rehearsal costs milliseconds. A meta tensor has no
values: code that reads one on the host (``.item()``, ``int(t)``) cannot run here, which is also what
keeps a forward free of host synchronisation (tests/unit/test_fullgraph.py).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.config.estimates import available_bytes, gib
from harness.errors import ConfigError
from harness.model.transformer import Transformer


@dataclass(frozen=True)
class Largest:
    nbytes: int
    shape: tuple[int, ...]
    where: str  # the module that made it ("blocks.0.attn.variant"), or "backward"


class Ledger(TorchDispatchMode):
    """Every storage an op makes counts its bytes until Python frees the last tensor over it: ``peak`` is
    the most held at once; ``largest`` the biggest single storage, with the shape and module that made it.
    Storages that existed before (parameters, buffers, inputs) are counted apart."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.live = self.peak = 0
        self.largest: Largest | None = None
        self.holders: dict[int, int] = {}  # storage -> tensors over it still alive
        self.flops = 0  # of the matrix products and attention kernels: the work that grows with the sizes
        self.stack: list[str] = []
        self.hooks = [
            h
            for name, m in model.named_modules()
            for h in (
                m.register_forward_pre_hook(lambda *_, n=name or "the model": self.stack.append(n)),
                m.register_forward_hook(lambda *_: self._leave()),
            )
        ]

    def _leave(self) -> None:  # a hook that returned a value would replace the module's output: not the popped name
        self.stack.pop()

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:  # .item(), int(t): a meta tensor has no value
            raise HostRead
        out = func(*args, **(kwargs or {}))
        self.flops += _matmul_flops(func, args)
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                self._hold(t)
        return out

    def _hold(self, t: Tensor) -> None:
        """Count ``t``'s storage once, while any tensor over it lives (views and ``_unsafe_view`` share one)."""
        storage = t.untyped_storage()
        key, n = storage._cdata, storage.nbytes()
        if key not in self.holders:
            self.holders[key] = 0
            self.live += n
            self.peak = max(self.peak, self.live)
            if self.largest is None or n > self.largest.nbytes:
                self.largest = Largest(n, tuple(t.shape), self.stack[-1] if self.stack else "backward")
        self.holders[key] += 1
        weakref.finalize(t, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.live -= n


class FusedAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on meta tensors takes the kernel torch would take on the CPU. On meta
    torch picks its math path, which stores the B·H·T·T weights; the CPU's fused (flash) kernel keeps
    B·H·T log-sum-exps instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args[0].is_meta and _cpu_takes_flash(*args[:3], **kwargs):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                *args[:3],
                kwargs.get("dropout_p", 0.0),
                kwargs.get("is_causal", False),
                attn_mask=kwargs.get("attn_mask"),
                scale=kwargs.get("scale"),
            )[0]
        return func(*args, **kwargs)


def _cpu_takes_flash(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **_,
) -> bool:
    """Whether torch's CPU dispatch would run this call on its flash kernel (asked on one-token CPU stand-ins)."""

    def stand_in(t: Tensor) -> Tensor:
        return torch.zeros(*t.shape[:-2], 1, t.shape[-1], dtype=t.dtype, device="cpu")

    mask = None if attn_mask is None else torch.zeros(*attn_mask.shape[:-2], 1, 1, dtype=attn_mask.dtype)
    with torch.device("cpu"):
        choice = torch._fused_sdp_choice(stand_in(q), stand_in(k), stand_in(v), mask, dropout_p, is_causal, scale=scale)
    return choice == 1  # SDPBackend.FLASH_ATTENTION


def _matmul_flops(func, args) -> int:
    """2·M·N·K of a matrix product (batched or not) and the flash kernel's forward (4·B·H·T·S·D) and backward
    (twice that); everything else is linear in the tensors' sizes, small beside these."""
    aten = torch.ops.aten
    if func in (aten.mm.default, aten.bmm.default):
        a, b = args[0], args[1]
    elif func in (aten.addmm.default, aten.baddbmm.default):
        a, b = args[1], args[2]
    elif func in (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    ):
        q, k = (args[1], args[2]) if "backward" in str(func) else (args[0], args[1])
        per = 4 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return per * (2 if "backward" in str(func) else 1)
    else:
        return 0
    return 2 * a.shape[:-1].numel() * a.shape[-1] * b.shape[-1]


class HostRead(Exception):
    """The forward read a tensor's value on the host, which a meta tensor does not have."""


@dataclass(frozen=True)
class Evaluation:
    """One final evaluation a run makes: the key that lists it, the length listed, the model's sequence length,
    the batch and how many batches."""

    key: str
    listed: int
    tokens: int
    batch: int
    batches: int


@dataclass(frozen=True)
class Phase:
    what: str  # "a training step", "scoring task.eval_lengths entry 100000"
    needs: int  # bytes
    largest: Largest | None
    fix: str  # the keys that shrink it, when no key is among the largest tensor's dimensions
    keys: dict[str, int]  # the config's integer values a dimension may come from, by key
    flops: int = 0  # of the phase: one training step, or every batch of an evaluation (the time check)


def rehearse(
    model: Transformer,
    values: dict,
    batch: int,
    length: int,
    evaluations: list[Evaluation],
    finetune: tuple[int, int] | None,
) -> list[Phase]:
    """The phases of a run of ``model`` (built on meta): training at ``batch`` × ``length``, a fine-tune
    step at ``finetune`` = (batch, length), and each of ``evaluations``."""
    keys = integer_keys(values)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    resident = weights + buffers + 2 * weights  # AdamW's two moments; gradients are counted as the step makes them
    step = _step(model, batch, length)
    phases = [
        Phase(
            "a training step",
            resident + step.peak,
            step.largest,
            "lower model.d_model, model.n_layers, data.batch_size or data.seq_len",
            keys,
            step.flops,
        )
    ]
    if finetune:
        tune_batch, tune_length = finetune
        step = _step(model, tune_batch, tune_length)
        phases.append(
            Phase(
                f"fine-tuning at eval.finetune_length={tune_length} ({tune_batch}×{tune_length} tokens)",
                resident + step.peak,
                step.largest,
                "shorten eval.finetune_length or set eval.finetune_steps=0",
                keys,
                step.flops,
            )
        )
    for e in evaluations:
        try:
            scored = _forward(model, e.batch, e.tokens)
        except ConfigError:  # a length the scheme refuses (learned's table): evaluation records it as skipped
            continue
        phases.append(
            Phase(
                f"scoring {e.key} entry {e.listed} ({e.batches} × {e.batch}×{e.tokens} tokens)",
                weights + buffers + scored.peak,
                scored.largest,
                f"drop {e.listed} from {e.key} or shorten it",
                {},
                scored.flops * e.batches,
            )
        )
    return phases


def _step(model: Transformer, batch: int, length: int) -> Ledger:
    """The ledger of a forward and backward over ``batch`` × ``length`` tokens (gradients included)."""
    model.train()
    try:
        return _measured(model, lambda: model(torch.zeros(batch, length, dtype=torch.long)).float().sum().backward())
    finally:
        model.zero_grad(set_to_none=True)


def _forward(model: Transformer, batch: int, length: int) -> Ledger:
    """The ledger of an evaluation forward over ``batch`` × ``length`` tokens."""
    model.eval()
    with torch.no_grad():
        return _measured(model, lambda: model(torch.zeros(batch, length, dtype=torch.long)))


def _measured(model: Transformer, run: Callable[[], object]) -> Ledger:
    """``run`` under a Ledger. A forward that reads a value on the host (randomized positions: a relative
    table spans the positions drawn) is measured up to the read, then again with positions 0 … T−1, which
    read nothing; the larger peak counts (the span's table is H·2S floats, small beside the rest)."""
    drawn, read = _ledger_of(model, run)
    if not read or not model.pos.randomize:
        return drawn
    shape = model.pos.shape
    model.pos.shape = dataclasses.replace(shape, sampling=None)  # positions 0 … T−1 for this pass
    try:
        whole, _ = _ledger_of(model, run)
    finally:
        model.pos.shape = shape
    return max(drawn, whole, key=lambda ledger: ledger.peak)


def _ledger_of(model: Transformer, run: Callable[[], object]) -> tuple[Ledger, bool]:
    """The ledger of ``run``, and whether it stopped where the forward read a value on the host."""
    with torch.device("meta"), FusedAttention(), Ledger(model) as ledger:
        try:
            run()
        except HostRead:
            return ledger, True
    return ledger, False


def integer_keys(values: dict, prefix: str = "") -> dict[str, int]:
    """Every integer leaf of the resolved config (``pos.mlp_width`` → 100000000), lists left out."""
    found = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(integer_keys(value, f"{path}."))
        elif isinstance(value, int) and not isinstance(value, bool) and value > 1:
            found[path] = value
    return found


def culprit(phase: Phase) -> str | None:
    """The config key that sets the largest dimension of the phase's largest tensor: the key of that value,
    or of a value up to 4× below it (CoPE's table holds 2·npos + 1 rows); then the same for the next dimension."""
    if phase.largest is None:
        return None
    largest = phase.largest
    keys = {k: v for k, v in phase.keys.items() if not k.startswith(("hydra.", "trainer.", "seed"))}
    for dim in sorted(set(largest.shape), reverse=True):
        named = sorted(
            (k for k, v in keys.items() if v <= dim <= 4 * v + 1),
            key=lambda k: (keys[k] != dim, not _owns(k, largest.where), -keys[k]),
        )
        if named:
            return named[0]
    return None


def _owns(key: str, where: str) -> bool:
    group = key.partition(".")[0]
    return (group == "pos" and where.startswith("pos")) or (group == "attn" and ".variant" in where)


# The measure against a real CPU step's peak (torch.profiler's allocations), every allowed pairing in
# tests/unit/test_rehearsal.py: at or above it, by less than this (a learned mask's hand-written backward keeps less
# than the meta path).
# A run is refused only past this much over the memory available, so no run that fits is stopped.
OVERCOUNT = 1.5


# A training step, or one evaluation length, that computes more than STEP_HOURS even at FAST_CPU_RATE is refused:
# it is a typo (task.eval_lengths=[80,100000]: hours for one length of a toy model), not an experiment for a CPU.
# The line is drawn by FLOPs at a fixed rate, not by a timing of this CPU: a short matmul timing swings with the
# machine's load, and --check and the run must give the same answer on a busy machine and an idle one.
STEP_HOURS = 1.0
FAST_CPU_RATE = 1e11  # FLOP/s: a fast laptop's fp32 matmul rate


@functools.cache
def cpu_flops_per_second() -> float:
    """This CPU's fp32 matmul rate, the best of five short trials (once a process). Only matrix products
    and attention kernels are counted, at the rate of the fastest of them: a time estimated from it is a lower
    bound."""
    import timeit

    a = torch.randn(256, 256)
    a @ a
    return 4 * 2 * 256**3 / min(timeit.repeat(lambda: a @ a, number=4, repeat=5))


def check_phases(phases: list[Phase]) -> None:
    """A CPU run's phases against this machine: memory first (the harder limit), then time; each refusal names the
    key that set the size."""
    free = available_bytes()
    if free is None:
        return
    for phase in phases:
        if phase.needs > OVERCOUNT * free:
            large = phase.largest
            made = (
                f"; its largest tensor, {'×'.join(map(str, large.shape))} in {large.where}, holds {gib(large.nbytes)}"
                if large
                else ""
            )
            raise ConfigError(
                f"{phase.what} needs {gib(phase.needs)}{made}, but {gib(free)} is available; {_fix(phase)}"
            )
    for phase in phases:
        if phase.flops > FAST_CPU_RATE * STEP_HOURS * 3600:
            rate = cpu_flops_per_second()  # for the message only: the decision above reads no clock
            raise ConfigError(
                f"{phase.what} computes {phase.flops:.2g} FLOP, more than {STEP_HOURS:g} h even at "
                f"{FAST_CPU_RATE / 1e9:,.0f} GFLOP/s (≈ {phase.flops / rate / 3600:,.1f} h on this CPU "
                f"now); {_fix(phase)}, or run it on a GPU"
            )


def _fix(phase: Phase) -> str:
    key = culprit(phase)
    return f"lower {key}={phase.keys[key]}, which sets that size" if key else phase.fix
