"""The comparison report: one row per scheme × attention, mean ± std over seeds.

Built from the MLflow store only (tags ``pos attn seed``, metric ``val/loss`` at the optimizer
step, ``train/tokens_per_s``, param ``model.n_params``, ``failure`` tags), so the sweep's own
report and ``python -m results report`` are the same function of the same data.

Conventions: losses in nats per predicted token; std is the sample std (ddof=1) over the
finished seeds, absent for a single seed; "steps to target" is the first optimizer step at
which a run's val loss is ≤ the target, averaged over the seeds that reached it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

LENGTH_METRIC = re.compile(r"^val/loss_at_(\d+)$")
SKIPPED_TAG = re.compile(r"^eval_skipped_at_(\d+)$")
GRID_KEYS = ("pos", "attn", "seed")  # sweep axes the report has columns for; others form a variant


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
    tokens_per_s: float | None = None
    n_params: int | None = None
    train_len: int | None = None
    at_length: dict[int, float] = field(default_factory=dict)
    skipped_lengths: dict[int, str] = field(default_factory=dict)
    job: int = 0

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def final_loss(self) -> float | None:
        return self.val[-1][1] if self.val else None

    @property
    def best_loss(self) -> float | None:
        return min(v for _, v in self.val) if self.val else None


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
    at_length: dict[int, Stat]

    @property
    def label(self) -> str:
        return f"{self.pos} {self.variant}".strip()

    @property
    def status(self) -> str:
        counts: dict[str, int] = {}
        for c in self.cells:
            counts[c.status] = counts.get(c.status, 0) + 1
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{n} {s}" for s, n in counts.items())


def mean_std(values: list[float]) -> Stat:
    if not values:
        return Stat(None, None, 0)
    mean = sum(values) / len(values)
    if len(values) < 2:
        return Stat(mean, None, 1)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return Stat(mean, math.sqrt(var), len(values))


def steps_to_target(val: list[tuple[int, float]], target: float) -> int | None:
    """First optimizer step whose val loss is ≤ target; None if never reached."""
    return next((step for step, loss in val if loss <= target), None)


def default_target(cells: list[Cell]) -> float | None:
    """The worst finished cell's final val loss: every finished cell reaches it."""
    finals = [c.final_loss for c in cells if c.finished and c.final_loss is not None]
    return max(finals) if finals else None


def group_cells(cells: list[Cell], target: float | None) -> list[Group]:
    keys: dict[tuple[str, str, str], list[Cell]] = {}
    for c in sorted(cells, key=lambda c: c.job):
        keys.setdefault((c.pos, c.attn, c.variant), []).append(c)
    return [_group(pos, attn, variant, members, target) for (pos, attn, variant), members in keys.items()]


def _group(pos: str, attn: str, variant: str, cells: list[Cell], target: float | None) -> Group:
    done = [c for c in cells if c.finished and c.val]
    steps = [steps_to_target(c.val, target) for c in done] if target is not None else []
    lengths = sorted({n for c in done for n in c.at_length})
    return Group(
        pos, attn, variant, cells,
        final=mean_std([c.final_loss for c in done]),
        best=mean_std([c.best_loss for c in done]),
        steps=mean_std([s for s in steps if s is not None]),
        tokens_per_s=mean_std([c.tokens_per_s for c in done if c.tokens_per_s is not None]),
        n_params=next((c.n_params for c in cells if c.n_params is not None), None),
        at_length={n: mean_std([c.at_length[n] for c in done if n in c.at_length]) for n in lengths},
    )


@dataclass
class Report:
    title: str  # names the sweep, used in every plot title
    cells: list[Cell]
    groups: list[Group]
    target: float | None
    target_note: str
    header: list[str]  # lines under the title: experiment, sweep, how to regenerate

    @property
    def lengths(self) -> list[int]:
        return sorted({n for g in self.groups for n in g.at_length} | {n for c in self.cells for n in c.skipped_lengths})


def build_report(cells: list[Cell], title: str, header: list[str], target: float | None = None) -> Report:
    note = "configured (report.target_loss / --target)"
    if target is None:
        target, note = default_target(cells), "the worst finished cell's final val loss"
    return Report(title, cells, group_cells(cells, target), target, note, header)


# ---------------------------------------------------------------- text outputs


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _steps(g: Group) -> str:
    done = sum(c.finished for c in g.cells)
    if g.steps.mean is None:
        return "—" if done == 0 else "not reached"
    reached = "" if g.steps.n == done else f" ({g.steps.n}/{done} seeds)"
    return g.steps.fmt(0) + reached


def _seeds(g: Group) -> str:
    return ",".join(c.seed for c in g.cells)


def markdown(r: Report, plots: list[str]) -> str:
    target = f"{r.target:.4f}" if r.target is not None else "—"
    variant = any(g.variant for g in r.groups)
    head = ["pos", "attn", *(["variant"] if variant else []), "seeds", "status", "final val loss",
            "best val loss", f"steps to {target}", "tokens/s", "params"]
    rows = [[g.pos, g.attn, *([g.variant] if variant else []), _seeds(g), g.status, g.final.fmt(), g.best.fmt(),
             _steps(g), g.tokens_per_s.fmt(0) if g.tokens_per_s.mean is not None else "—", _num(g.n_params, 0)]
            for g in r.groups]
    lines = [f"# {r.title}", "", *r.header, "",
             "## Scheme × attention", "",
             *_md_table(head, rows), "",
             f"Losses in nats/token (mean ± sample std over finished seeds). Target loss {target} nats/token: "
             f"{r.target_note}. Steps are optimizer steps; tokens/s is training throughput.", ""]
    if r.lengths:
        lines += ["## Loss vs evaluation length (nats/token)", "", *_md_table(*_length_rows(r)), "",
                  "n/a: the scheme refuses that length (see the run's `eval_skipped_at_<L>` tag).", ""]
    cell_head = ["cell", "run", "status", "final val loss", "tokens/s", "reason"]
    cell_rows = [[c.label, c.name, c.status, _num(c.final_loss, 4), _num(c.tokens_per_s, 0), c.reason]
                 for c in sorted(r.cells, key=lambda c: c.job)]
    lines += ["## Cells", "", *_md_table(cell_head, cell_rows), ""]
    lines += [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _length_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    head = ["pos", "attn", *(f"L={n}" for n in r.lengths)]
    rows = []
    for g in r.groups:
        skipped = {n for c in g.cells for n in c.skipped_lengths}
        row = [g.at_length[n].fmt() if n in g.at_length else ("n/a" if n in skipped else "—") for n in r.lengths]
        rows.append([g.label, g.attn, *row])
    return head, rows


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731 — a pipe would split the column
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(cell(x) for x in row) + " |" for row in rows)]


def to_csv(r: Report) -> str:
    out = io.StringIO()
    lengths = r.lengths
    fields = ["pos", "attn", "variant", "seeds", "n_finished", "status",
              "final_val_loss_mean", "final_val_loss_std", "best_val_loss_mean", "best_val_loss_std",
              "target_loss", "steps_to_target_mean", "steps_to_target_std", "seeds_reaching_target",
              "tokens_per_s_mean", "n_params", *(f"val_loss_at_{n}_mean" for n in lengths)]
    writer = csv.writer(out)
    writer.writerow(fields)
    opt = lambda v: "" if v is None else v  # noqa: E731 — CSV has no None
    for g in r.groups:
        writer.writerow([g.pos, g.attn, g.variant, _seeds(g), g.final.n, g.status,
                         opt(g.final.mean), opt(g.final.std), opt(g.best.mean), opt(g.best.std),
                         opt(r.target), opt(g.steps.mean), opt(g.steps.std), g.steps.n,
                         opt(g.tokens_per_s.mean), opt(g.n_params),
                         *(opt(g.at_length[n].mean if n in g.at_length else None) for n in lengths)])
    return out.getvalue()


def cells_table(cells: list[Cell]) -> str:
    """The console summary a sweep prints at its end: one line per cell."""
    cells = sorted(cells, key=lambda c: c.job)
    width = max([len("cell"), *(len(c.label) for c in cells)])
    lines = [f"{'cell':<{width}}  {'status':<12}  {'val loss':>9}  {'tokens/s':>9}"]
    for c in cells:
        lines.append(f"{c.label:<{width}}  {c.status:<12}  {_num(c.final_loss, 4):>9}  {_num(c.tokens_per_s, 0):>9}")
    lines += [f"  {c.label}: {c.reason}" for c in cells if c.reason]
    return "\n".join(lines)


def write_report(r: Report, out_dir: Path) -> list[Path]:
    """report.md, report.csv and the PNG plots into out_dir; returns the paths written."""
    from results import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    written = plots.draw_all(r, out_dir)
    (out_dir / "report.csv").write_text(to_csv(r))
    (out_dir / "report.md").write_text(markdown(r, [p.name for p in written]))
    return [out_dir / "report.md", out_dir / "report.csv", *written]
