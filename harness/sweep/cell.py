"""One cell of a sweep, inside its Hydra job: train it, or adopt its finished run, or record why not.

A job never raises out of a multirun (Hydra's basic sweeper re-raises the first failed job after the
batch and then skips ``on_multirun_end``). Every outcome is on record in MLflow: a trained cell's run
is closed by its owner (``TrackedRun``) as FINISHED or FAILED; a cell refused before its run opened
(an incompatible pairing, a bad value) gets a FAILED run with the reason, made by the same owner.

The one exception is the machine itself: a write that fails for want of space (a full disk, a file-size limit, a
read-only or failing device: ``harness.errors.write_failure``) would fail every later cell alike, each with its
own lines. The first such failure stops the sweep with one line and exit 1 (``MachineFault``); its parent run is
closed as the sweep's exit closes it, and the same command run again keeps the finished cells.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback

from harness.config.spec import RunSpec
from harness.errors import (
    MachineFault,
    StoreDamaged,
    damaged_store_line,
    said_write_failure,
    store_damage,
    write_failure,
)
from harness.integrity import RecordDamaged, seal, warn
from harness.record.resume import config_hash
from harness.record.run import TrackedRun, failure_tags, flatten
from harness.record.store import Store, resolve_tracking_uri
from harness.scaleout import is_rank_zero, rank_zero_print
from harness.train import cell_tags, format_summary, run_name, train


def train_cell(spec: RunSpec, sweep_tags: dict[str, str]) -> float | None:
    """Train one cell; never raises (except on interrupt), so the sweep goes on.

    Returns the final val loss, or None for a failed cell (already recorded in MLflow).
    """
    if spec.run.resume is None:  # a sweep reads resume: null as auto (finished cells skipped, others resumed)
        spec = dataclasses.replace(spec, run=dataclasses.replace(spec.run, resume="auto"))
    skipped = skip_finished(spec, sweep_tags)
    if skipped is not None:
        return skipped
    run = TrackedRun(
        resolve_tracking_uri(spec.logger.tracking_uri),
        spec.logger.experiment,
        run_name(spec.choices, spec.seed),
        sweep_tags,
    )
    try:
        summary = train(spec, run)
    except Exception as e:
        if said_write_failure(
            e,
            "the sweep stops at this cell (every later one would fail alike): free space "
            "(or raise the limit) and run the same command again: finished cells are kept",
        ):
            MachineFault.seen = write_failure(e)  # the machine, not the cell: every later cell would fail alike
            raise MachineFault(1) from None
        damaged = str(e) if isinstance(e, StoreDamaged) else store_damage(e)
        if damaged:  # the store every later cell writes to: the sweep stops here
            line = str(e) if isinstance(e, StoreDamaged) else damaged_store_line(run.uri, damaged)
            print(f"{line}; the sweep stops at this cell", file=sys.stderr)
            MachineFault.seen = "the tracking store was damaged while a cell wrote to it"
            raise MachineFault(1) from None
        failure = failure_tags(e)
        # refused before its run existed: a run made and closed FAILED at once, so the sweep's table shows why
        if not run.opened and is_rank_zero():
            try:
                run.start(cell_tags(spec), flatten(spec.values))
                run.end("FAILED", failure)
            except Exception as bad:  # e.g. the store itself is what was refused
                print(
                    f"warning: could not record the refused cell in MLflow ({type(bad).__name__}: {bad})",
                    file=sys.stderr,
                )
        if failure["failure"] == "error":  # a crash: the traceback is what one needs to fix it
            traceback.print_exc()
        else:  # an expected outcome of a sweep (refused, diverged): one line
            print(f"{failure['failure']}: {failure['failure_reason']}", file=sys.stderr)
        return None
    rank_zero_print(format_summary(summary))  # SLURM tasks of one job: rank 0 speaks
    return summary.val_loss


def skip_finished(spec: RunSpec, sweep_tags: dict[str, str]) -> float | None:
    """A re-run sweep does not retrain a cell whose exact config already FINISHED in this store:
    that run is adopted as a child of this sweep and its final val loss returned. Unfinished
    cells resume from their checkpoint."""
    if spec.run.resume is False:  # resume=false: retrain every cell
        return None
    try:
        store = Store.open(resolve_tracking_uri(spec.logger.tracking_uri))
        runs = store.search(  # the latest FINISHED run of this exact config
            spec.logger.experiment,
            f"tags.config_hash = '{config_hash(spec.values, store.uri)}' and attributes.status = 'FINISHED'",
            max_results=1,
            order_by=["attributes.end_time DESC"],
        )
    except RecordDamaged as e:  # its record changed since it closed (harness/integrity.py): not adopted
        warn(e, "this cell trains again")
        return None
    except Exception:  # e.g. a bad store: train() refuses it with the reason
        return None
    if not runs:
        return None
    run = runs[0]
    if is_rank_zero():  # SLURM runs this job on every task: a second adopt would take this sweep for the old parent
        adopt(store, run, sweep_tags)
    loss = run.data.metrics.get("val/loss")
    print(
        f"skipped: {sweep_tags.get('sweep_cell') or run.info.run_name} already FINISHED as MLflow run "
        f"{run.info.run_id} (val/loss {loss}); now a child of this sweep"
    )
    return loss


def adopt(store: Store, run, sweep_tags: dict[str, str]) -> None:
    """Make a FINISHED run a child of the current sweep, remembering its previous parent."""
    from mlflow.entities import RunTag

    previous = run.data.tags.get("mlflow.parentRunId")
    tags = {
        **sweep_tags,
        **({"adopted_from_parent": previous} if previous else {}),
        "skipped_in_sweep": sweep_tags.get("sweep_id", ""),
    }
    store.client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    seal(store.client, run.info.run_id)  # its record was checked when it was found; now with the sweep's tags
