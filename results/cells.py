"""A sweep's data model: one ``Cell`` per run, ``Group``s of seeds per scheme × attention, the ``Report``.

Built from the MLflow store only (tags ``pos attn seed``, metric ``val/loss`` at the optimizer
step, ``train/tokens_per_s``, ``diag/mean_distance`` and ``diag/entropy`` where a run had diagnostics=true,
param ``model.n_params``, ``failure`` tags), so the sweep's own
report and ``python -m results report`` are the same function of the same data.

Conventions: losses in nats per predicted token; std is the sample std (ddof=1) over the
finished seeds, absent for a single seed; "steps to target" is the first optimizer step at
which a run's val loss is ≤ the target, averaged over the seeds that reached it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.sequential import Design

# every evaluation condition of harness/model/extrapolation.py: val/[finetuned/][<scaling>/]loss_at_<L>[_stride_<S>
# | _last_<K>]
CONDITION_METRIC = re.compile(
    r"^val/(?:(?P<prefix>(?:finetuned/)?[a-z0-9_]+)/)?loss_at_(?P<length>\d+)"
    r"(?:_stride_(?P<stride>\d+)|_last_(?P<last>\d+))?$"
)
SKIPPED_TAG = re.compile(r"^eval_skipped_at_(\d+)$")
GRID_KEYS = ("pos", "attn", "seed")  # sweep axes the report has columns for; others form a variant
# overrides that choose the pos or attn column's value (its tag: a class's own name, a per-layer pattern's),
# so a sweep over them is a sweep over that column: pos._target_=positional.rope.Rope,mypkg.decay.Decay
NAMING_KEYS = ("pos._target_", "attn._target_", "pos.layers", "attn.layers")
MIN_ORDER_GAIN = 0.05  # report.min_order_gain's default (conf/config.yaml; docs/verdicts.md)
ALPHA = (
    0.05  # report.alpha's default: the family-wise level a report's (or a claim's) comparisons are Holm-corrected to
)
BASELINE_TAG = "report_baseline"  # the sweep's parent run: report.baseline as declared when the sweep started
ALPHA_TAG = "report_alpha"  # and report.alpha, the family-wise level its comparisons are corrected to
MARGIN_TAG = "report_margin"  # and report.margin, the equivalence margin ("": none declared)
GAIN_TAG = "report_min_order_gain"  # and report.min_order_gain, below which a cell is not yet using order
STAGES_TAG = "report_stages"  # report.seeds=auto: "stage,max_seeds,spending[,claim]" of its looks ("": fixed seeds)


@dataclass(frozen=True)
class Declared:
    """The pos each scheme of a report is compared with, and when it was named (before the results, or not)."""

    pos: str
    when: str  # "declared before the sweep ran (report.baseline)", …


@dataclass
class Cell:
    """One run of a sweep (one Hydra job)."""

    run_id: str
    name: str
    label: str  # the cell's swept overrides (tag sweep_cell), else the run name
    pos: str
    attn: str
    seed: str
    status: str  # finished | incompatible | diverged | error | aborted | killed | running
    reason: str = ""
    variant: str = ""  # swept overrides other than pos/attn/seed: grouped apart, not pooled
    val: list[tuple[int, float]] = field(default_factory=list)  # (optimizer step, val loss)
    gains: list[tuple[int, float]] = field(default_factory=list)  # (optimizer step, val/order_gain)
    tokens_per_s: float | None = None
    n_params: int | None = None
    train_len: int | None = None
    skipped_lengths: dict[int, str] = field(default_factory=dict)
    job: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # every metric's last value
    # where word order can come from: "scheme" (a positional scheme), "causal mask" (NoPE with a causal
    # mask), "none" (NoPE, bidirectional: permutation-equivariant, its order gain is 0 by construction)
    order_signal: str = "scheme"
    # where randomized positions (pos.randomize) were evaluated: "sampled" (from [0, max_position), the default)
    # or "ordered" (0 … T−1); None for a cell without randomized positions
    eval_positions: str | None = None
    max_position: int | None = None
    task: str = ""  # the run's task (tag ``task``): ``mixture`` or one task's name
    windows: dict[str, list[float]] | None = None  # the final validation per window (results/spread.py)

    @property
    def order_gain(self) -> float | None:
        return self.metrics.get("val/order_gain")

    @property
    def acc(self) -> float | None:
        return self.metrics.get("val/acc")

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def final_loss(self) -> float | None:
        return self.val[-1][1] if self.val else None


@dataclass(frozen=True)
class Stat:
    mean: float | None
    std: float | None  # None for fewer than two values
    n: int

    def fmt(self, digits: int = 4) -> str:
        if self.mean is None:
            return "—"
        return f"{self.mean:.{digits}f}" + (f" ± {self.std:.{digits}f}" if self.std is not None else "")


@dataclass
class Group:
    """One scheme × attention (× variant) over its seeds."""

    pos: str
    attn: str
    variant: str
    cells: list[Cell]
    final: Stat
    best: Stat
    steps: Stat  # over the seeds that reached the target
    tokens_per_s: Stat
    n_params: int | None
    order_gain: Stat  # val/order_gain: nats/token lost when the order inside a window is shuffled
    acc: Stat  # val/acc (synthetic tasks): exact match on in-distribution lengths
    attn_distance: Stat = Stat(None, None, 0)  # over the finished seeds that logged diagnostics
    # val/bpc at the end: bits per byte of text (a text task's val loss, tokenizer-independent)
    bpc: Stat = Stat(None, None, 0)
    attn_entropy: Stat = Stat(None, None, 0)  # diag/entropy, nats
    # evaluation condition (_condition_name) -> length -> loss over the finished seeds
    conditions: dict[str, dict[int, Stat]] = field(default_factory=dict)

    @property
    def at_length(self) -> dict[int, Stat]:
        """Length -> loss over the finished seeds, scored in windows (``val/loss_at_<L>``)."""
        return self.conditions.get("windows", {})

    @property
    def order_signal(self) -> str:
        return self.cells[0].order_signal  # group_cells makes a group of one cell or more

    def using_order(self, min_gain: float) -> bool | None:
        """Whether the model uses word order (None: it cannot, or nothing was measured)."""
        return None if self.order_signal == "none" or self.order_gain.mean is None else self.order_gain.mean >= min_gain

    def gain_curve(self) -> list[tuple[int, float]]:
        """The mean val/order_gain over the finished seeds at each validation step they all logged."""
        curves = [dict(c.gains) for c in self.cells if c.finished and c.gains]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        return [(s, sum(c[s] for c in curves) / len(curves)) for s in steps]

    @property
    def finals(self) -> list[float]:
        return [c.final_loss for c in self.cells if c.finished and c.final_loss is not None]

    @property
    def label(self) -> str:
        return f"{self.pos} {self.variant}".strip()

    @property
    def status(self) -> str:
        counts = Counter(c.status for c in self.cells)  # in the order first seen
        return next(iter(counts)) if len(counts) == 1 else ", ".join(f"{n} {s}" for s, n in counts.items())


def mean_std(values: list[float]) -> Stat:
    if not values:
        return Stat(None, None, 0)
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return Stat(mean, std, len(values))


def steps_to_target(val: list[tuple[int, float]], target: float) -> int | None:
    """First optimizer step whose val loss is ≤ target; None if never reached."""
    return next((step for step, loss in val if loss <= target), None)


def default_target(cells: list[Cell]) -> float | None:
    """The worst finished cell's final val loss: every finished cell reaches it."""
    return max((c.final_loss for c in cells if c.finished and c.final_loss is not None), default=None)


def group_cells(cells: list[Cell], target: float | None) -> list[Group]:
    keys: dict[tuple[str, str, str], list[Cell]] = {}
    for c in sorted(cells, key=lambda c: c.job):
        keys.setdefault((c.pos, c.attn, c.variant), []).append(c)
    return [_group(pos, attn, variant, members, target) for (pos, attn, variant), members in keys.items()]


def _group(pos: str, attn: str, variant: str, cells: list[Cell], target: float | None) -> Group:
    done = [c for c in cells if c.finished and c.val]
    steps = [steps_to_target(c.val, target) for c in done] if target is not None else []
    return Group(
        pos,
        attn,
        variant,
        cells,
        final=mean_std([c.final_loss for c in done if c.final_loss is not None]),
        best=mean_std([min(v for _, v in c.val) for c in done]),  # each finished seed's lowest val loss
        steps=mean_std([s for s in steps if s is not None]),
        tokens_per_s=mean_std([c.tokens_per_s for c in done if c.tokens_per_s is not None]),
        n_params=next((c.n_params for c in cells if c.n_params is not None), None),
        attn_distance=mean_std([c.metrics["diag/mean_distance"] for c in done if "diag/mean_distance" in c.metrics]),
        attn_entropy=mean_std([c.metrics["diag/entropy"] for c in done if "diag/entropy" in c.metrics]),
        order_gain=mean_std([c.order_gain for c in done if c.order_gain is not None]),
        acc=mean_std([c.acc for c in done if c.acc is not None]),
        bpc=mean_std([c.metrics["val/bpc"] for c in done if "val/bpc" in c.metrics]),
        conditions=_conditions(done),
    )


def _condition_name(match: re.Match, part: bool = False) -> str:
    """How a CONDITION_METRIC was scored, in words: ``windows``, ``sliding, stride 16``, ``yarn``,
    ``yarn, fine-tuned``, ``last 32 tokens``; ``reverse (mixture part)`` where the prefix is a part of
    task=mixture (``part``: the run logged that part's accuracy), not a scaling."""
    prefix = match["prefix"] or ""
    scaling = prefix.removeprefix("finetuned/") + (" (mixture part)" if part else "")
    how = (
        f"sliding, stride {match['stride']}"
        if match["stride"]
        else (f"last {match['last']} tokens" if match["last"] else "")
    )
    words = [w for w in (scaling, how) if w] or ["windows"]
    return ", ".join(words + (["fine-tuned"] if prefix.startswith("finetuned/") else []))


def _conditions(done: list[Cell]) -> dict[str, dict[int, Stat]]:
    found: dict[str, dict[int, list[float]]] = {}
    for c in done:
        for key, value in c.metrics.items():
            if m := CONDITION_METRIC.match(key):
                name = _condition_name(m, part=f"val/{m['prefix']}/token_acc" in c.metrics)
                found.setdefault(name, {}).setdefault(int(m["length"]), []).append(value)
    return {name: {n: mean_std(v) for n, v in sorted(by_len.items())} for name, by_len in found.items()}


def own_metric(cell: Cell, metric: str) -> str:
    """The name ``cell``'s run logged ``metric`` under. A claim names a mixture part's metric
    (``val/reverse/token_acc_at_12``, harness/data/tasks/mixture.py); a run trained on that task alone
    (``task=reverse``) logs the same measure unprefixed (``val/token_acc_at_12``), so that is what is read."""
    found = re.fullmatch(r"val/([A-Za-z_]\w*)/(.+)", metric)
    return f"val/{found[2]}" if found and found[1] == cell.task else metric


@dataclass
class Report:
    title: str  # names the sweep, used in every plot title
    cells: list[Cell]
    groups: list[Group]
    target: float | None
    target_note: str
    header: list[str]  # lines under the title: experiment, sweep, how to regenerate
    min_order_gain: float = MIN_ORDER_GAIN
    baseline: Declared | None = None  # the pos each scheme is compared with, and when it was named
    alpha: float = ALPHA  # report.alpha: the family-wise level of the verdicts (Holm), as the sweep recorded it
    margin: float | None = None  # report.margin: the equivalence margin the sweep recorded (None: none declared)
    staged: Design | None = None  # report.seeds=auto: the design its sweeper decided by (None: fixed seeds)

    @property
    def lengths(self) -> list[int]:
        return sorted(
            {n for g in self.groups for n in g.at_length} | {n for c in self.cells for n in c.skipped_lengths}
        )


def build_report(
    cells: list[Cell],
    title: str,
    header: list[str],
    target: float | None = None,
    min_order_gain: float = MIN_ORDER_GAIN,
    baseline: Declared | None = None,
    alpha: float = ALPHA,
    margin: float | None = None,
    staged: Design | None = None,
) -> Report:
    note = "configured (report.target_loss / --target)"
    if target is None:
        target, note = default_target(cells), "the worst finished cell's final val loss"
    return Report(
        title, cells, group_cells(cells, target), target, note, header, min_order_gain, baseline, alpha, margin, staged
    )
