"""A tuning sweep's report (``experiment=tune_lr``): each pos × attn cell's best searched values.

Read from the MLflow store only: each trial is a child run whose ``sweep_cell`` tag holds its grid
coordinates and the values its study tried (``optim.optimizer.lr=... optim.schedule.warmup_steps=...``),
scored by its final val loss (nats/token, the value the study minimised). Writes ``best.json`` (what
``optim.tuned=<path>`` reads, harness/config/load.py) and ``README.md`` (the table, every trial, the
command and the sweep's wall time).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import integrity
from harness.markdown import table
from results.cells import Cell


def cell_key(pos: str, attn: str) -> str:
    """How best.json names a cell; harness/config/load.py looks cells up by the same key."""
    return f"pos={pos} attn={attn}"


def searched_values(cell: Cell) -> dict[str, object]:
    """The values a trial's study chose, from its swept overrides other than the grid's, read as Hydra read them for
    the trial (``1e-05`` is a float there; YAML 1.1 would keep it a string): the numbers a study draws."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return {o.split("=", 1)[0]: parser.parse_override(o).value() for o in cell.variant.split()}


@dataclass
class Tuned:
    key: str
    trials: list[Cell]  # in launch order

    @property
    def finished(self) -> list[Cell]:
        return [c for c in self.trials if c.finished and c.final_loss is not None]

    @property
    def best(self) -> Cell | None:
        return min(self.finished, key=_final_loss, default=None)


def _final_loss(trial: Cell) -> float:
    assert trial.final_loss is not None, "Tuned.finished keeps only trials with a final val loss"
    return trial.final_loss


def _tune_cells(cells: list[Cell]) -> list[Tuned]:
    groups: dict[str, list[Cell]] = {}
    for c in sorted(cells, key=lambda c: c.job):
        groups.setdefault(cell_key(c.pos, c.attn), []).append(c)
    return [Tuned(key, trials) for key, trials in sorted(groups.items())]


def _best_json(tuned: list[Tuned], source: dict[str, str]) -> dict:
    cells = {
        t.key: {
            "values": searched_values(t.best),
            "val_loss": t.best.final_loss,
            "run_id": t.best.run_id,
            "trials": len(t.trials),
            "finished": len(t.finished),
        }
        for t in tuned
        if t.best is not None
    }
    return {**source, "metric": "final val/loss, nats/token", "cells": cells}


def markdown(tuned: list[Tuned], source: dict[str, str], wall_min: float | None) -> str:
    keys = sorted({k for t in tuned for c in t.trials for k in searched_values(c)})
    rows = []
    for t in tuned:
        best = searched_values(t.best) if t.best else {}
        worst = max(map(_final_loss, t.finished), default=None)
        rows.append(
            [
                t.key,
                f"{len(t.trials)} ({len(t.finished)})",
                *(_fmt(best.get(k)) for k in keys),
                _loss(t.best.final_loss if t.best else None),
                _loss(worst),
            ]
        )
    trial_rows = [
        [t.key, str(i), *(_fmt(searched_values(c).get(k)) for k in keys), c.status, _loss(c.final_loss)]
        for t in tuned
        for i, c in enumerate(t.trials)
    ]
    wall = f"{wall_min:.1f} minutes" if wall_min is not None else "unknown (the sweep has not ended)"
    return "\n".join(
        [
            f"# Tuned learning rates: experiment `{source['experiment']}`, sweep `{source['sweep_id']}`",
            "",
            f"Command: `{source['command']}`  ",
            f"Wall time of the sweep on this machine: {wall}  ",
            f"Regenerate: `{source['regenerate']}`",
            "",
            "Each cell's own TPE study (harness/sweep/tune.py); a trial's score is its final val loss "
            "(nats/token). `best.json` holds the best values; `optim.tuned=results/tune_lr/best.json` reruns any "
            "preset at them.",
            "",
            *table(
                ["cell", "trials (finished)", *(f"best {k}" for k in keys), "best val loss", "worst val loss"],
                rows,
                escape=True,
            ),
            "",
            "## Every trial",
            "",
            *table(["cell", "trial", *keys, "status", "final val loss"], trial_rows, escape=True),
            "",
        ]
    )


def _fmt(value) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _loss(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def write(client, sweep, out: Path, regenerate: str) -> list[Path]:
    """best.json and README.md of ``sweep`` (a results.store.Sweep) into ``out``, the staging folder
    ``integrity.report_folder`` made (``python -m results tune``)."""
    from results.store import cells_of

    if sweep.parent is None:
        raise LookupError(f"experiment {sweep.experiment!r} has no sweep; run python run.py -m experiment=tune_lr")
    info = sweep.parent.info
    source = {
        "experiment": sweep.experiment,
        "sweep_id": sweep.sweep_id,
        "parent_run_id": info.run_id,
        "command": f"python run.py -m {sweep.parent.data.tags.get('sweep_overrides', '')}".strip(),
        "regenerate": regenerate,
    }
    tuned = _tune_cells(cells_of(client, sweep))
    wall = (info.end_time - info.start_time) / 60_000 if info.end_time else None
    integrity.write(out / "best.json", _best_json(tuned, source))  # sealed: optim.tuned refuses it changed
    (out / "README.md").write_text(markdown(tuned, source, wall))
    return [out / "best.json", out / "README.md"]
