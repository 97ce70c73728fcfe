"""Paired timing: two steps timed back to back in alternating order (A B, B A, …, "ABBA"), so drift in
the machine's speed (other load, clock frequency) cancels within a round instead of landing on one side.

``paired_rounds`` runs rounds until the 95 % interval of the ratio is on one side of the goal, or its
round or time budget is spent (then the verdict is "unresolved": not measured precisely enough).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from harness.bench.cells import Built, Spec
from harness.bench.measure import Step, make_step, time_call
from harness.bench.stats import MIN_ROUNDS, Goal, Interval


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
