"""Reading a sweep back from the MLflow store into report cells.

A sweep's parent run carries tags ``sweep_role=parent`` and ``sweep_id``; its children carry
``mlflow.parentRunId`` (MLflow's own nesting tag, which the UI understands) and ``sweep_id``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast
from unittest import mock

from harness import integrity
from harness.paths import project_root
from harness.record.preflight import store_to_read
from harness.record.run import WINDOWS_ARTIFACT
from harness.record.store import Store
from harness.sequential import Design, Spending
from results.cells import (
    ALPHA,
    ALPHA_TAG,
    BASELINE_TAG,
    GAIN_TAG,
    GRID_KEYS,
    MARGIN_TAG,
    MIN_ORDER_GAIN,
    NAMING_KEYS,
    SKIPPED_TAG,
    STAGES_TAG,
    Cell,
    Declared,
    build_report,
)

if TYPE_CHECKING:
    from mlflow.entities import Run

PARENT_FILTER = "tags.sweep_role = 'parent'"


def open_store(tracking_uri: str | None):
    """The store to read: it must exist already (reading never creates one), whole (harness/record/preflight.py)."""
    uri = store_to_read(tracking_uri)
    return uri, Store.open(uri).client


@dataclass
class Sweep:
    experiment: str
    experiment_id: str
    sweep_id: str | None  # None: every posbench run of the experiment, no sweep
    parent: Run | None
    runs: list[Run]  # the children

    @property
    def title(self) -> str:
        return (
            f"posbench · experiment {self.experiment}"
            if self.parent is None
            else f"posbench · {self.parent.info.run_name} ({self.sweep_id})"
        )


def _search_all(client, experiment_id: str, filter_string: str = "") -> list:
    runs, token = [], None
    while True:  # search_runs pages at max_results
        page = client.search_runs([experiment_id], filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def find_sweep(client, experiment: str, sweep_id: str | None = None) -> Sweep:
    """The given sweep, else the latest sweep of the experiment, else all its posbench runs."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"no experiment {experiment!r} in this store; pass --tracking-uri or set MLFLOW_TRACKING_URI")
    parents = client.search_runs(
        [exp.experiment_id],
        PARENT_FILTER + (f" and tags.sweep_id = '{sweep_id}'" if sweep_id else ""),
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    parent = parents[0] if parents else None
    if parent is None and sweep_id:
        raise LookupError(f"no sweep {sweep_id!r} in experiment {experiment!r}; omit --sweep for the latest one")
    # posbench's cells (a run of another project has none), with those a later sweep adopted (harness/sweep/cell.py):
    # they still ran in this one, and its report lists them
    where = [
        f"tags.`{tag}` = '{parent.info.run_id}'" for tag in ("mlflow.parentRunId", "adopted_from_parent") if parent
    ]
    runs = [r for w in where or [""] for r in _search_all(client, exp.experiment_id, w) if "pos" in r.data.tags]
    if not runs:
        raise LookupError(
            (
                f"the latest sweep of experiment {experiment!r} (parent run {parent.info.run_id}) holds "
                "no posbench run (none has a pos tag): another project's runs? Point --tracking-uri at "
                "the store posbench wrote, or --sweep at one of its sweeps"
            )
            if parent
            else f"experiment {experiment!r} holds no posbench run (none has a pos tag): another project's "
            "runs? Point --tracking-uri at the store posbench wrote, or name a posbench experiment"
        )
    return Sweep(experiment, exp.experiment_id, parent.data.tags["sweep_id"] if parent else None, parent, runs)


def cell_of(client, run, windows: bool = False) -> Cell:
    """``windows``: also read the run's per-window validation losses (an artifact download: the report's spread
    table needs them; a claim's look or a tuning report does not)."""
    tags, params = run.data.tags, run.data.params
    status, reason = _status(run)
    history = client.get_metric_history(run.info.run_id, "val/loss") if status != "incompatible" else []
    throughput = client.get_metric_history(run.info.run_id, "train/tokens_per_s") if history else []
    gains = client.get_metric_history(run.info.run_id, "val/order_gain") if history else []
    return Cell(
        run_id=run.info.run_id,
        name=run.info.run_name,
        label=tags.get("sweep_cell") or run.info.run_name,
        pos=tags.get("pos", "?"),
        attn=tags.get("attn", "?"),
        seed=tags.get("seed", "?"),
        status=status,
        reason=reason,
        variant=_variant(tags.get("sweep_cell", "")),
        val=sorted((m.step, m.value) for m in history),
        gains=sorted((m.step, m.value) for m in gains),
        # the logged windows' tokens ÷ their seconds: each window trains the same tokens, so the harmonic mean
        tokens_per_s=len(throughput) / sum(1 / m.value for m in throughput) if throughput else None,
        n_params=int(params["model.n_params"]) if "model.n_params" in params else None,
        train_len=int(params["data.seq_len"]) if params.get("data.seq_len", "").isdigit() else None,
        skipped_lengths={int(m[1]): v for k, v in tags.items() if (m := SKIPPED_TAG.match(k))},
        job=int(tags.get("sweep_job", 0)) if tags.get("sweep_job", "0").isdigit() else 0,
        metrics=dict(run.data.metrics),
        order_signal=tags.get("order_signal", "scheme"),
        task=tags.get("task", ""),
        windows=run_windows(client, run.info.run_id) if windows and status == "finished" else None,
        **_sampling(params),
    )


def run_windows(client, run_id: str) -> dict[str, list[float]] | None:
    """The run's per-window validation losses (harness/model/module.py); None for a run that did not record them."""
    text = artifact_text(client, run_id, WINDOWS_ARTIFACT)
    return None if text is None else json.loads(text)


def artifact_text(client, run_id: str, name: str) -> str | None:
    """A file the run logged (None: it logged none by that name), checked against its seal when it was logged with
    one (harness/integrity.py's ``sealed_files``); MLflow's download progress bar kept off the report's output."""
    logged = {a.path for a in client.list_artifacts(run_id)}
    if name not in logged:
        return None
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.dict(os.environ, {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}),
    ):
        path = Path(client.download_artifacts(run_id, name, tmp))
        if integrity.seal_path(path).name in logged:
            client.download_artifacts(run_id, integrity.seal_path(path).name, tmp)
            integrity.check_file(path, f"train run {run_id} again (its artifacts are not what it logged)")
        return path.read_text()


def _sampling(params: dict[str, str]) -> dict:
    """A randomized cell's evaluation positions (pos.eval_positions: null means sampled) and range."""
    if params.get("pos.randomize") != "True":
        return {}
    mode, top = params.get("pos.eval_positions", "None"), params.get("pos.max_position", "")
    return {
        "eval_positions": "sampled" if mode == "None" else mode,
        "max_position": int(top) if top.isdigit() else None,
    }


def cells_of(client, sweep: Sweep, windows: bool = False) -> list:
    """The sweep's runs as cells in launch order (MLflow lists them newest first), so per-seed figures read seed 0
    first."""
    cells = [cell_of(client, run, windows) for run in sweep.runs]
    if sweep.sweep_id is None:  # no job numbers: order by start time
        for c, run in zip(cells, sweep.runs, strict=True):
            c.job = run.info.start_time
    return sorted(cells, key=lambda c: c.job)


def _status(run) -> tuple[str, str]:
    tags = run.data.tags
    if run.info.status == "FINISHED":
        return "finished", ""
    if run.info.status == "FAILED":
        return tags.get("failure", "error"), tags.get("failure_reason", "")
    return run.info.status.lower(), tags.get("failure_reason", "")  # killed, running, scheduled


def _variant(cell: str) -> str:
    """The swept overrides of a cell other than those naming its pos/attn/seed, e.g. ``optim.optimizer.lr=1e-4``."""
    return " ".join(o for o in cell.split() if o.split("=", 1)[0].lstrip("+~") not in (*GRID_KEYS, *NAMING_KEYS))


def regenerate_command(sweep: Sweep, out_dir=None, options: str = "", command: str = "report") -> str:
    """The ``python -m results <command>`` (report or tune) that rewrites this report where it is being written
    (relative to the project root when inside it: the checkout, or the working directory of an installed copy);
    without out_dir, results/<experiment>/. ``options``: the report's settings the sweep did not record
    (``--target …``)."""
    root = project_root()
    out = Path(out_dir).resolve() if out_dir is not None else root / "results" / sweep.experiment
    shown = out.relative_to(root) if out.is_relative_to(root) else out
    return (
        f"python -m results {command} --experiment {sweep.experiment}"
        + (f" --sweep {sweep.sweep_id}" if sweep.sweep_id else "")
        + options
        + f" --out {shown}/"
    )


def _unchecked(sweep: Sweep) -> str:
    """How many of the sweep's runs were read without a seal to check them against (closed before seals)."""
    old = integrity.unsealed([*sweep.runs, *([sweep.parent] if sweep.parent else [])])
    return f" ({len(old)} closed before posbench sealed run records: their values are read unchecked)" if old else ""


def sweep_report(
    client,
    sweep: Sweep,
    target: float | None = None,
    shown_out=None,
    min_order_gain: float | None = None,
    baseline: str | None = None,
):
    """The ``Report`` of ``sweep`` from the store. ``shown_out``: the directory its Regenerate line names
    (default results/<experiment>/, e.g. when it is written to a temporary one). ``baseline`` and
    ``min_order_gain``: given after the sweep ran (``--baseline``, ``--min-order-gain``); None: those its parent run
    recorded when it started (``report.baseline``, ``report.min_order_gain``)."""
    tags = sweep.parent.data.tags if sweep.parent else {}
    recorded = float(tags.get(GAIN_TAG) or MIN_ORDER_GAIN)
    min_order_gain = recorded if min_order_gain is None else min_order_gain
    options = (  # the parent run records report.baseline, alpha, margin and min_order_gain, not the target
        (f" --target {target}" if target is not None else "")
        + (f" --min-order-gain {min_order_gain}" if min_order_gain != recorded else "")
        + (f" --baseline {baseline}" if baseline else "")
    )
    header = [
        f"Experiment `{sweep.experiment}`"
        + (f", sweep `{sweep.sweep_id}` (parent run `{sweep.parent.info.run_id}`)" if sweep.parent else "")
        + f", {len(sweep.runs)} runs"
        + _unchecked(sweep)
        + (f", git `{sweep.parent.data.tags.get('git_sha', '?')}`" if sweep.parent else "")
        + ".",
        "",
        f"Regenerate: `{regenerate_command(sweep, shown_out, options)}`",
    ]
    declared = (
        Declared(baseline, "given to the report after the sweep ran (--baseline)")
        if baseline
        else Declared(tags[BASELINE_TAG], "declared before the sweep ran (report.baseline)")
        if tags.get(BASELINE_TAG)
        else None
    )
    return build_report(
        cells_of(client, sweep, windows=True),
        sweep.title,
        header,
        target,
        min_order_gain,
        declared,
        float(tags.get(ALPHA_TAG) or ALPHA),
        float(tags[MARGIN_TAG]) if tags.get(MARGIN_TAG) else None,
        staged_design(sweep, claim=False),
    )


def staged_design(sweep: Sweep, claim: bool):
    """The design of a sweep that added seeds in stages (report.seeds=auto, its parent's ``report_stages``) when it
    decided by its preset's claim (``claim``) or by each pos against the baseline (not ``claim``); else None (the
    other kind's seeds are then read as fixed: one look at the seeds there are)."""
    parent = getattr(sweep, "parent", None)
    tags = parent.data.tags if parent else {}
    stage, most, spending, *by = (tags.get(STAGES_TAG) or ",,").split(",")
    if not stage or (by == ["claim"]) != claim:
        return None
    margin = float(tags[MARGIN_TAG]) if tags.get(MARGIN_TAG) else None
    return Design(float(tags.get(ALPHA_TAG) or ALPHA), int(stage), int(most), cast(Spending, spending), margin)
