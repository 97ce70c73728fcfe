"""Where an arm's spread comes from: the seeds, or the finite validation sample.

Every run scores the same validation windows and records each window's loss (harness/model/module.py,
``val_windows.json``), so an arm's runs form a seeds × windows table x[s, w]: window w's summed loss over the mean
scored tokens per window, so that row s averages to run s's ``val/loss``. Under the additive two-way model
without replication, x[s, w] = μ + a_s + b_w + e_sw (seed, window and their interaction as random effects;
Searle, Casella & McCulloch 1992, *Variance Components*, ch. 4), the run-to-run variance of ``val/loss`` is

    Var(row mean) = σ_a² + σ_e² / n,

σ_a² the trained models' own differences, which only more seeds average out, and σ_e² / n how differently each
model fares on the n windows drawn, which more validation windows shrink (``data.eval_batches``; null: the whole
split). The method-of-moments estimates: σ_e² = the residual mean square, σ_a² = (sample variance of the row means)
− σ_e² / n, floored at 0. The window effects b_w are common to every run of every arm, so they move no spread; in
a difference of two arms they cancel up to what differs between the arms per window, whose error on Δ is
sd_w(Δ_w) / √n (Δ_w: window w's mean over the seeds of one arm minus the other's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Split:
    runs: int
    windows: int
    spread: float  # the sample sd of the runs' val/loss
    seeds: float  # σ_a: between the seeds' models
    sample: float  # σ_e / √n: the validation sample's part of one run's val/loss

    @property
    def shrinks(self) -> str:
        """What would shrink the spread more: its larger part."""
        return "more seeds" if self.seeds >= self.sample else "more validation windows (data.eval_batches)"


def table(records: list[dict[str, list[float]]]) -> np.ndarray | None:
    """The seeds × windows table of an arm's runs from their ``val_windows.json`` records; None when fewer than
    two runs recorded windows or the runs did not score the same windows (their token counts differ)."""
    if len(records) < 2:
        return None
    tokens = np.asarray(records[0]["tokens"], dtype=np.float64)
    if len(tokens) < 2 or tokens.sum() <= 0 or any(not np.array_equal(r["tokens"], tokens) for r in records):
        return None
    return np.asarray([r["loss_sum"] for r in records], dtype=np.float64) / tokens.mean()


def split(x: np.ndarray) -> Split:
    """The spread of ``x``'s row means, split into seeds and validation sample (this module's docstring)."""
    s, n = x.shape
    rows, columns = x.mean(axis=1), x.mean(axis=0)
    residual = x - rows[:, None] - columns[None, :] + x.mean()
    interaction = float((residual**2).sum()) / ((s - 1) * (n - 1))
    between = float(rows.var(ddof=1))
    return Split(s, n, math.sqrt(between), math.sqrt(max(between - interaction / n, 0.0)), math.sqrt(interaction / n))


def paired_error(x: np.ndarray, y: np.ndarray) -> float | None:
    """The error a finite validation sample puts on Δ = mean(x) − mean(y) of two arms scored on the same windows:
    sd_w(Δ_w) / √n; None when the tables do not share their windows."""
    if x.shape[1] != y.shape[1]:
        return None
    per_window = x.mean(axis=0) - y.mean(axis=0)
    return float(per_window.std(ddof=1) / math.sqrt(len(per_window)))
