"""One benchmark run: measures cells once each (a cell shared by the grid, a peer and a target is
measured once) and keeps a cell's warm step alive while a target or a peer comparison times it again.

Per cell: the FLOP-counting step runs first (it warms every kernel and buffer up) and also gives the
peak allocated memory; then up to ``repeats`` timed steps (fewer past ``cell_s`` seconds).

Paired timing: two warm steps timed back to back in alternating order (A B, B A, …, "ABBA"), so drift in
the machine's speed (other load, clock frequency) cancels within a round instead of landing on one side.
``paired_rounds`` runs rounds until the 95 % interval of the ratio is on one side of the goal, or its
round or time budget is spent (then the verdict is "unresolved": not measured precisely enough).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from harness.bench.cells import Built, Spec, build_posbench
from harness.bench.measure import (
    PeakRss,
    Step,
    count_flops,
    make_step,
    peak_allocated_bytes,
    time_call,
    timed_steps,
    trim,
)
from harness.bench.stats import MIN_ROUNDS, Goal, Interval
from harness.errors import ConfigError, one_line


@dataclass
class Result:
    """One measured cell: a row of bench.csv and one MLflow run."""

    name: str  # "posbench" or the peer's name
    pos: str
    attn: str
    seq_len: int
    batch: int
    step_s: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_mem_mb: float = float("nan")  # peak bytes of tensors allocated by one step (see measure.py)
    rss_delta_mb: float = float("nan")  # peak RSS increase during the timed steps (CPU; allocator-dependent)
    flops: float = float("nan")
    mfu: float = float("nan")
    repeats: int = 0  # timed steps behind step_s
    status: str = "ok"  # ok | refused | error | skipped
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Live(NamedTuple):
    step: Step  # one call = one training step
    module: torch.nn.Module


def prepare(spec: Spec, build: Callable[[Spec], Built], device: str) -> Live:
    """Build a cell's model on ``device`` with random token ids (bf16 autocast on CUDA)."""
    module, forward = build(spec)
    module.to(device).train()
    ids = torch.randint(256, (spec.batch, spec.seq_len), device=device)
    return Live(make_step(forward, module, ids, autocast=device == "cuda"), module)


def paired_rounds(
    num: Step, den: Step, device: str, goal: Goal | None = None, max_rounds: int = 40, budget_s: float = 30.0
) -> Interval:
    """The median of step(num)/step(den) over ABBA rounds of two warm steps (num first in even rounds, den first
    in odd ones), with its 95 % interval (``Interval.of_ratios``). After ``MIN_ROUNDS`` (fewer have no such
    interval), stop as soon as the interval is on one side of ``goal``, or after ``max_rounds`` rounds or
    ``budget_s`` seconds, whichever comes first."""
    started = time.perf_counter()
    ratios: list[float] = []
    while len(ratios) < max(max_rounds, MIN_ROUNDS):
        if len(ratios) % 2 == 0:
            t_num, t_den = time_call(num, device), time_call(den, device)
        else:
            t_den, t_num = time_call(den, device), time_call(num, device)
        ratios.append(t_num / t_den)
        if len(ratios) >= MIN_ROUNDS and (
            (goal is not None and goal.resolved(Interval.of_ratios(ratios)))
            or time.perf_counter() - started >= budget_s
        ):
            break
    return Interval.of_ratios(ratios)


@dataclass
class Options:
    device: str
    peak_flops: float  # the run's matmul peak (FLOP/s), for each cell's MFU column
    peak_n: int = 2048  # the matrix size that reached it
    warmup: int = 0
    repeats: int = 3
    cell_s: float = 5.0


@dataclass
class Session:
    options: Options
    measured: dict[tuple[str, Spec], Result] = field(default_factory=dict)
    _live: dict[tuple[str, Spec], Live] = field(default_factory=dict)

    def cell(
        self, spec: Spec, name: str = "posbench", build: Callable[[Spec], Built] = build_posbench, keep: bool = False
    ) -> Result:
        """The cell's result, measuring it the first time; ``keep``: hold its warm step for ``step``."""
        key = (name, spec)
        if key not in self.measured:
            self.measured[key], live = self._measure(name, spec, build)
            print(_line(self.measured[key]))
            if keep and live is not None:
                self._live[key] = live
        elif keep and key not in self._live and self.measured[key].ok:  # measured earlier, released since
            self._live[key] = prepare(spec, build, self.options.device)
            self._live[key].step()  # warm
        return self.measured[key]

    def step(self, spec: Spec, name: str = "posbench") -> Step:
        return self._live[(name, spec)].step

    def model(self, spec: Spec, name: str = "posbench"):
        return self._live[(name, spec)].module

    def release(self) -> None:
        """Drop every kept step (and its model), so the next cell's memory starts clean."""
        self._live.clear()
        trim()

    def _measure(self, name: str, spec: Spec, build: Callable[[Spec], Built]) -> tuple[Result, Live | None]:
        r, o = Result(name, spec.pos, spec.attn, spec.seq_len, spec.batch), self.options
        try:
            live = prepare(spec, build, o.device)
            peak_bytes = peak_allocated_bytes(lambda: setattr(r, "flops", count_flops(live.step)), o.device)
            with PeakRss() as rss:
                times = timed_steps(live.step, o.device, o.warmup, o.repeats, o.cell_s)
            r.peak_mem_mb, r.rss_delta_mb = peak_bytes / 2**20, rss.delta_mb
            r.step_s, r.repeats = statistics.median(times), len(times)
            r.tokens_per_s = spec.batch * spec.seq_len / r.step_s
            r.mfu = r.flops / r.step_s / o.peak_flops
        except ConfigError as e:
            r.status, r.reason, live = "refused", str(e), None
        except Exception as e:  # a broken cell is recorded, the run goes on (and exits non-zero)
            r.status, r.reason, live = "error", one_line(f"{type(e).__name__}: {e}")[:300], None
        trim()
        return r, live


def _line(r: Result) -> str:
    shown = (
        (f"{r.step_s * 1e3:9.1f} ms {r.tokens_per_s:10,.0f} tok/s {r.peak_mem_mb:8.1f} MB MFU {r.mfu:6.1%}")
        if r.ok
        else f"{r.status}: {r.reason[:90]}"
    )
    return f"  {r.name:30s} {r.pos:>14s} {r.attn:>9s} T={r.seq_len:<6d} B={r.batch:<3d} {shown}"
