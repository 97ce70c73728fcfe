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

import sys
import traceback

from omegaconf import DictConfig, OmegaConf, open_dict

from harness.errors import (
    MachineFault,
    StoreDamaged,
    damaged_store_line,
    said_write_failure,
    store_damage,
    write_failure,
)
from harness.record.resume import config_hash
from harness.record.run import TrackedRun, failure_tags, flatten
from harness.record.seal import RecordDamaged, seal, warn
from harness.record.store import Store, resolve_tracking_uri
from harness.scaleout import is_rank_zero, rank_zero_print
from harness.train import cell_tags, format_summary, run_name, train


def train_cell(cfg: DictConfig, choices: dict[str, str], sweep_tags: dict[str, str],
               constructions=None) -> float | None:
    """Train one cell; never raises (except on interrupt), so the sweep goes on. ``constructions``: the models the
    sweep's preflight constructed (harness/config/deferred.py).

    Returns the final val loss, or None for a failed cell (already recorded in MLflow).
    """
    skipped = skip_finished(cfg, sweep_tags)
    if skipped is not None:
        return skipped
    run = TrackedRun(resolve_tracking_uri(cfg.logger.tracking_uri), cfg.logger.experiment,
                     run_name(choices, cfg.seed), sweep_tags)
    try:
        summary = train(cfg, choices, run, constructions)
    except Exception as e:
        if said_write_failure(e, "the sweep stops at this cell (every later one would fail alike): free space "
                                 "(or raise the limit) and run the same command again: finished cells are kept"):
            MachineFault.seen = write_failure(e)  # the machine, not the cell: every later cell would fail alike
            raise MachineFault(1) from None
        damaged = str(e) if isinstance(e, StoreDamaged) else store_damage(e)
        if damaged:  # the store every later cell writes to: the sweep stops here
            line = str(e) if isinstance(e, StoreDamaged) else damaged_store_line(run.uri, damaged)
            print(f"{line}; the sweep stops at this cell", file=sys.stderr)
            MachineFault.seen = "the tracking store was damaged while a cell wrote to it"
            raise MachineFault(1) from None
        if not run.opened and is_rank_zero():  # refused before its run existed: record it
            _record_refusal(run, cfg, choices, e)
        failure = failure_tags(e)
        if failure["failure"] == "error":  # a crash: the traceback is what one needs to fix it
            traceback.print_exc()
        else:  # an expected outcome of a sweep (refused, diverged): one line
            print(f"{failure['failure']}: {failure['failure_reason']}", file=sys.stderr)
        return None
    rank_zero_print(format_summary(summary))  # SLURM tasks of one job: rank 0 speaks
    return summary.val_loss


def _record_refusal(run: TrackedRun, cfg: DictConfig, choices: dict[str, str], exc: BaseException) -> None:
    try:
        run.record_refusal(cell_tags(cfg, choices), flatten(_container(cfg)), exc)
    except Exception as e:  # e.g. the store itself is what was refused
        print(f"warning: could not record the refused cell in MLflow ({type(e).__name__}: {e})", file=sys.stderr)


def _container(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # the refusal may be an unresolvable interpolation itself
        return OmegaConf.to_container(cfg, resolve=False)


def skip_finished(cfg: DictConfig, sweep_tags: dict[str, str]) -> float | None:
    """A re-run sweep does not retrain a cell whose exact config already FINISHED in this store:
    that run is adopted as a child of this sweep and its final val loss returned. Unfinished
    cells resume from their checkpoint (``resume: null`` reads as auto in a sweep)."""
    if cfg.get("resume") is False:  # resume=false: retrain every cell
        return None
    if cfg.get("resume") is None:
        with open_dict(cfg):
            cfg.resume = "auto"
    try:
        store = Store.open(resolve_tracking_uri(cfg.logger.tracking_uri))
        run = finished_run(cfg, store)
    except RecordDamaged as e:  # its record changed since it closed (harness/record/seal.py): not adopted
        warn(e, "this cell trains again")
        return None
    except Exception:  # e.g. an unresolvable config or a bad store: train() refuses it with the reason
        return None
    if run is None:
        return None
    adopt(store, run, sweep_tags)
    loss = run.data.metrics.get("val/loss")
    print(f"skipped: {sweep_tags.get('sweep_cell') or run.info.run_name} already FINISHED as MLflow run "
          f"{run.info.run_id} (val/loss {loss}); now a child of this sweep")
    return loss


def finished_run(cfg: DictConfig, store: Store):
    """The latest FINISHED run of this exact config in the store, or None."""
    h = config_hash(cfg, store.uri)
    runs = store.search(cfg.logger.experiment, f"tags.config_hash = '{h}' and attributes.status = 'FINISHED'",
                        max_results=1, order_by=["attributes.end_time DESC"])
    return runs[0] if runs else None


def adopt(store: Store, run, sweep_tags: dict[str, str]) -> None:
    """Make a FINISHED run a child of the current sweep, remembering its previous parent."""
    from mlflow.entities import RunTag

    previous = run.data.tags.get("mlflow.parentRunId")
    tags = {**sweep_tags, **({"adopted_from_parent": previous} if previous else {}),
            "skipped_in_sweep": sweep_tags.get("sweep_id", "")}
    store.client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    seal(store.client, run.info.run_id)  # its record was checked when it was found; now with the sweep's tags
