"""Shares of a training step, timed inside the step by torch.profiler: the positional scheme's own ops
(``positional_share``), the matrix-multiply and attention kernels (``kernel_share``), and two steps of
a ratio side by side, op by op (``breakdown``: where a comparison that misses its goal loses its time).

An end-to-end ratio (step with RoPE ÷ step without) on a shared 2-core machine spreads per round far
wider than a 2 % goal. Inside one step the profiler times exactly the scheme's ops: each of
its hooks (embed, rotary and every ``rotate*``/``at_width`` of what rotary returns, logit_biases) runs
in a ``record_function`` range; forward time is the ranges' time, backward time that of the autograd
nodes the ranges' ops created (matched by sequence number). Overhead = positional / (step − positional):
what the step would lose without those ops.

Wrapping is generic (any scheme, any hook) and undone afterwards; the model is not modified.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from harness.bench.measure import time_call

RANGE = "posbench.positional"


def _ranged(fn, wrap_result: bool = False):
    """``fn`` run inside ``RANGE``; ``wrap_result``: what it returns (a rotary object) wrapped in ``_Profiled``."""

    def call(*args, **kwargs):
        with record_function(RANGE):
            out = fn(*args, **kwargs)
        return _Profiled(out) if wrap_result and out is not None else out

    return call


class _Profiled:
    """Delegates to a rotary object; its rotate*/at_width calls run inside the positional range."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr) or not (name.startswith("rotate") or name == "at_width"):
            return attr
        return _ranged(attr, wrap_result=name == "at_width")


@contextmanager
def _positional_ranges(scheme: torch.nn.Module):
    """Run the scheme's hooks inside ``RANGE`` while the context is open (instance attributes shadow the
    class's methods, and are deleted afterwards)."""
    hooks = ("embed", "rotary", "logit_biases")
    for name in hooks:
        setattr(scheme, name, _ranged(getattr(scheme, name), wrap_result=name == "rotary"))
    try:
        yield
    finally:
        for name in hooks:
            del scheme.__dict__[name]


@dataclass(frozen=True)
class Share:
    forward_s: float  # the scheme's hooks (their ranges)
    backward_s: float  # the autograd nodes its ops created
    step_s: float  # the profiled step, wall clock

    @property
    def positional_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def overhead(self) -> float:
        return self.positional_s / max(self.step_s - self.positional_s, 1e-12)


def positional_share(scheme: torch.nn.Module, step, steps: int) -> list[Share]:
    """Profile ``steps`` calls of ``step`` (a warm training step of a model holding ``scheme``)."""
    shares = []
    with _positional_ranges(scheme):
        for _ in range(steps):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                wall = time_call(step, "cpu")
            forward_us, backward_us = _positional_us(prof.events())
            shares.append(Share(forward_us / 1e6, backward_us / 1e6, wall))
    return shares


def _positional_us(events) -> tuple[float, float]:
    """Forward: the ranges' total time. Backward: evaluate_function events of the nodes created inside a
    range. An op reports the sequence number of the next node whether or not it creates one, so a number
    belongs to the last forward op that reported it (ops that create no node pass theirs on)."""
    events = sorted(events, key=lambda e: e.time_range.start)
    ranges = [e for e in events if e.name == RANGE and (e.cpu_parent is None or e.cpu_parent.name != RANGE)]
    spans = [(r.time_range.start, r.time_range.end) for r in ranges]
    creator = {
        e.sequence_nr: e
        for e in events
        if e.sequence_nr >= 0 and e.fwd_thread == 0 and not e.name.startswith("autograd::")
    }
    ours = {
        nr
        for nr, e in creator.items()
        if any(start <= e.time_range.start and e.time_range.end <= end for start, end in spans)
    }
    backward = sum(
        e.cpu_time_total
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and e.sequence_nr in ours
    )
    return sum(r.cpu_time_total for r in ranges), backward


# matrix products and fused attention: the kernels two implementations of one model at one shape share
KERNEL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


def op_times(step, steps: int = 2) -> dict[str, float]:
    """Self time of each op per call of ``step`` (seconds), over ``steps`` profiled calls (CPU)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return {e.key: e.self_cpu_time_total / 1e6 / steps for e in prof.key_averages() if e.self_cpu_time_total > 0}


def paired_op_times(num, den, rounds: int = 4) -> tuple[dict[str, float], dict[str, float]]:
    """``op_times`` of two steps, one profiled step at a time in ABBA order (as the paired rounds time
    them), each op's median over the rounds: a shared machine's speed drifts within a minute, so two steps
    profiled back to back on each side can disagree with the ratio the rounds measure."""
    runs: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
    for i in range(rounds):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            runs[side].append(op_times((num, den)[side], steps=1))
    return _median_per_op(runs[0]), _median_per_op(runs[1])


def _median_per_op(runs: list[dict[str, float]]) -> dict[str, float]:
    return {op: statistics.median(r.get(op, 0.0) for r in runs) for op in set().union(*runs)}


def kernel_share(times: dict[str, float]) -> float:
    """The share of a (warm, CPU) step's op time spent in ``KERNEL_OPS`` (``times`` from ``op_times``).
    1 / share bounds what removing every other op (fusing all elementwise work, say) could gain: the
    peers table's ceiling."""
    return sum(t for op, t in times.items() if op in KERNEL_OPS) / max(sum(times.values()), 1e-12)


@dataclass(frozen=True)
class OpRow:
    op: str
    num_s: float  # self time per step on each side
    den_s: float

    @property
    def difference_s(self) -> float:
        return self.num_s - self.den_s


@dataclass(frozen=True)
class Breakdown:
    """Where two steps of a ratio (num ÷ den) spend their time, op by op, and how much the side that
    would have to get faster (num for an at-most goal, den for an at-least one) must lose to meet the
    goal at these profiled times: the report's answer to "why is this not met, and what would close it"."""

    num: str  # labels of the two sides
    den: str
    rows: tuple[OpRow, ...]  # the ops whose times differ most, largest first; the rest in ``other``
    other: OpRow
    goal_op: str  # the goal's "<=" or ">="
    goal: float

    @property
    def num_s(self) -> float:
        return sum(r.num_s for r in self.rows) + self.other.num_s

    @property
    def den_s(self) -> float:
        return sum(r.den_s for r in self.rows) + self.other.den_s

    @property
    def side(self) -> str:
        """The side whose step must get shorter to meet the goal."""
        return self.num if self.goal_op == "<=" else self.den

    @property
    def cut_s(self) -> float:
        """How much shorter ``side``'s step must be for num ÷ den to meet the goal (0 if it does)."""
        if self.goal_op == "<=":
            return max(0.0, self.num_s - self.goal * self.den_s)
        return max(0.0, self.den_s - self.num_s / self.goal)


def breakdown(
    num: dict[str, float], den: dict[str, float], labels: tuple[str, str], goal_op: str, goal: float, top: int = 8
) -> Breakdown:
    """``num``, ``den``: ``op_times`` of the two steps; the ``top`` ops by |difference| get a row each."""
    rows = sorted(
        (OpRow(op, num.get(op, 0.0), den.get(op, 0.0)) for op in num.keys() | den.keys()),
        key=lambda r: (-abs(r.difference_s), r.op),
    )
    rest = rows[top:]
    other = OpRow("all other ops", sum(r.num_s for r in rest), sum(r.den_s for r in rest))
    return Breakdown(*labels, tuple(rows[:top]), other, goal_op, goal)
