"""Sweeps: one MLflow parent run per Hydra multirun, one child run per cell, a report at the end.

How the parent id reaches the jobs: ``on_multirun_start`` (in the launching process) creates
the parent run and writes ``<hydra.sweep.dir>/mlflow_sweep.json``. Each job finds its sweep
dir from its own Hydra config (``hydra.runtime.output_dir`` minus ``hydra.sweep.subdir``), so
this works in-process (basic launcher), in local worker processes (joblib) and on cluster
nodes that share the filesystem (submitit) — no globals, no environment to inherit.

Failures: a job never raises out of a multirun (Hydra's basic sweeper re-raises the first
failed job after the batch and then skips ``on_multirun_end``). Every failure is recorded on
the cell's child run — FAILED with tags ``failure`` and ``failure_reason`` — and the exit code
is decided at the end from the store: 0 when every cell finished or was refused as
incompatible (and at least one finished), 2 when nothing could be trained, 1 otherwise.
"""

from __future__ import annotations

import atexit
import json
import signal
import sys
import time
import traceback
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

RECORD = "mlflow_sweep.json"
OK_STATUSES = ("finished", "incompatible")


@dataclass
class SweepRecord:
    """What a job needs to attach itself to its sweep; written once, read by every job."""

    parent_run_id: str
    sweep_id: str
    tracking_uri: str
    experiment: str
    swept_keys: list[str]

    def save(self, sweep_dir: Path) -> None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / RECORD).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, sweep_dir: Path) -> "SweepRecord | None":
        path = sweep_dir / RECORD
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def child_tags(self, job_overrides: list[str], job_num: int) -> dict[str, str]:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(job_overrides)
        cell = " ".join(o.input_line for o in parsed if o.get_key_element() in self.swept_keys)
        return {"mlflow.parentRunId": self.parent_run_id, "sweep_id": self.sweep_id,
                "sweep_cell": cell, "sweep_job": str(job_num)}


def job_sweep_dir(hydra_cfg) -> Path:
    """The sweep dir as the launcher made it, from inside a job (robust to hydra.job.chdir)."""
    out = Path(hydra_cfg.runtime.output_dir)  # absolute: <sweep.dir>/<sweep.subdir>
    depth = len(Path(str(hydra_cfg.sweep.subdir)).parts)
    return out.parents[depth - 1] if depth else out


# ---------------------------------------------------------------- the job side


def run_cell(cfg: DictConfig, choices: dict[str, str], sweep_tags: dict[str, str]) -> float | None:
    """Train one cell; never raises (except on interrupt), so the sweep goes on.

    Returns the final val loss, or None for a failed cell (already recorded in MLflow).
    """
    from harness.scaleout import is_rank_zero, rank_zero_print
    from harness.record.tracking import failure_tags
    from harness.train import format_summary, train

    skipped = skip_finished(cfg, sweep_tags)
    if skipped is not None:
        return skipped
    try:
        summary = train(cfg, choices, extra_tags=sweep_tags)
    except Exception as e:
        if not getattr(e, "mlflow_run_id", None) and is_rank_zero():  # failed before its run existed
            record_failed_cell(cfg, choices, sweep_tags, e)
        failure = failure_tags(e)
        if failure["failure"] == "error":  # a crash: the traceback is what one needs to fix it
            traceback.print_exc()
        else:  # an expected outcome of a sweep (refused, diverged): one line
            print(f"{failure['failure']}: {failure['failure_reason']}", file=sys.stderr)
        return None
    rank_zero_print(format_summary(summary))  # SLURM tasks of one job: rank 0 speaks
    return summary.val_loss


def skip_finished(cfg: DictConfig, sweep_tags: dict[str, str]) -> float | None:
    """A re-run sweep does not retrain a cell whose exact config already FINISHED in this store:
    that run is adopted as a child of this sweep and its final val loss returned. Unfinished
    cells resume from their checkpoint (``resume: null`` reads as auto in a sweep)."""
    from omegaconf import open_dict

    from harness.record.resume import adopt, finished_run
    from harness.record.tracking import resolve_tracking_uri

    if cfg.get("resume") is False:  # resume=false: retrain every cell
        return None
    if cfg.get("resume") is None:
        with open_dict(cfg):
            cfg.resume = "auto"
    uri = resolve_tracking_uri(cfg.logger.tracking_uri)
    try:
        run = finished_run(cfg, uri)
    except Exception:  # e.g. an unresolvable config: train() refuses it with the reason
        return None
    if run is None:
        return None
    adopt(uri, run, sweep_tags)
    loss = run.data.metrics.get("val/loss")
    print(f"skipped: {sweep_tags.get('sweep_cell') or run.info.run_name} already FINISHED as MLflow run "
          f"{run.info.run_id} (val/loss {loss}); now a child of this sweep")
    return loss


def record_failed_cell(cfg: DictConfig, choices: dict[str, str], sweep_tags: dict[str, str],
                       exc: BaseException) -> str:
    """A FAILED child run for a cell refused before training (e.g. an incompatible pairing)."""
    from mlflow.entities import Param

    from harness.record.tracking import _client, experiment_id, failure_tags, flatten, resolve_tracking_uri
    from harness.train import cell_tags, run_name

    uri = resolve_tracking_uri(cfg.logger.tracking_uri)
    client = _client(uri)
    tags = {**cell_tags(cfg, choices), **sweep_tags, **failure_tags(exc)}
    run = client.create_run(experiment_id(client, cfg.logger.experiment, uri),
                            run_name=run_name(choices, cfg.seed), tags=tags)
    try:
        params = [Param(k, v) for k, v in flatten(_container(cfg)).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(run.info.run_id, params=params[i : i + 100])
    finally:
        client.set_terminated(run.info.run_id, status="FAILED")
    return run.info.run_id


def _container(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # the refusal may be an unresolvable interpolation itself
        return OmegaConf.to_container(cfg, resolve=False)


# ---------------------------------------------------------------- the launching side


def sweep_name(task_overrides: list[str]) -> tuple[str, list[str]]:
    """``sweep pos=rope,t5 attn=performer`` from the sweep's overrides, and the swept keys."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(task_overrides)
    swept = [o for o in parsed if o.is_sweep_override()]
    shown = swept or parsed  # `-m` over single values: name it by all its overrides
    return "sweep " + (" ".join(o.input_line for o in shown) or "(defaults)"), [o.get_key_element() for o in swept]


def exit_code(statuses: list[str]) -> int:
    if any(s not in OK_STATUSES for s in statuses):
        return 1
    if "finished" not in statuses:
        return 2  # nothing trained: like a single run with a bad config
    return 0


class MlflowSweep(Callback):
    """Registered under ``hydra.callbacks`` (conf/config.yaml); active only for ``-m``."""

    def __init__(self) -> None:
        self.client = self.record = None
        self.closed = True
        self.previous_sigterm = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # Hydra turns a callback's exception into a warning and carries on; a sweep without
        # its parent would scatter orphan runs, so stop here with a one-line error instead.
        try:
            self._start(config)
        except Exception as e:
            print(f"error: cannot create the sweep's MLflow parent run ({type(e).__name__}: {e}); "
                  "check logger.tracking_uri or $MLFLOW_TRACKING_URI", file=sys.stderr)
            sys.exit(2)

    def _start(self, config: DictConfig) -> None:
        from harness.record.resume import close_dead_parents, parent_tags
        from harness.record.tracking import _client, experiment_id, git_sha, resolve_tracking_uri

        overrides = list(config.hydra.overrides.task)
        # a preset's own axes (hydra.sweeper.params) are swept too, unless the command line pins them
        params = config.hydra.sweeper.get("params") or {}
        preset_axes = [f"{k}={v}" for k, v in params.items() if not any(o.startswith(f"{k}=") for o in overrides)]
        name, swept = sweep_name(overrides + preset_axes)
        uri = resolve_tracking_uri(config.logger.tracking_uri)
        self.client = _client(uri)
        sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        tags = {"sweep_role": "parent", "sweep_id": sweep_id, "sweep_overrides": " ".join(overrides)[:5000],
                "sweep_dir": str(sweep_dir), "git_sha": git_sha(), **parent_tags()}
        exp_id = experiment_id(self.client, config.logger.experiment, uri)
        run = self.client.create_run(exp_id, run_name=name, tags=tags)
        close_dead_parents(self.client, exp_id, keep=run.info.run_id)  # earlier sweeps killed hard
        self.record = SweepRecord(run.info.run_id, sweep_id, uri, config.logger.experiment, swept)
        self.closed = False
        atexit.register(self._abort)  # no parent left RUNNING if the sweep dies before its end
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # SIGTERM would skip atexit
            self.previous_sigterm = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
        self.record.save(sweep_dir)
        print(f"sweep {sweep_id}: MLflow parent run {run.info.run_id} ({name!r})")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.record is None:
            return
        code = 1
        try:
            code = self._finish(config)
        except Exception:
            traceback.print_exc()
            print("error: the sweep's report failed (above); its cells are in MLflow", file=sys.stderr)
        finally:
            self._close("FINISHED" if code == 0 else "FAILED")
        if code:
            sys.exit(code)  # after all cells ran; Hydra's own exit would be 0

    def _finish(self, config: DictConfig) -> int:
        import tempfile

        from results.report import cells_table
        from results.store import cells_of, find_sweep, generate

        sweep = find_sweep(self.client, self.record.experiment, self.record.sweep_id)
        if self._close_stray(sweep.runs):
            sweep = find_sweep(self.client, self.record.experiment, self.record.sweep_id)
        cells = cells_of(self.client, sweep)
        code = exit_code([c.status for c in cells])
        print(f"\n{sweep.title} · {len(cells)} cells · exit {code}\n{cells_table(cells)}\n")
        with tempfile.TemporaryDirectory() as tmp:
            generate(self.client, sweep, tmp, OmegaConf.select(config, "report.target_loss"))
            self.client.log_artifacts(self.record.parent_run_id, tmp)
            # the run description is rendered on the parent's page in the MLflow UI
            self.client.set_tag(self.record.parent_run_id, "mlflow.note.content", (Path(tmp) / "report.md").read_text())
        print(f"report: artifacts of MLflow run {self.record.parent_run_id} (experiment '{self.record.experiment}')")
        return code

    def _close_stray(self, runs: list) -> bool:
        """A job killed hard (e.g. an OOM-killed worker) leaves its run RUNNING: close it."""
        stray = [run for run in runs if run.info.status == "RUNNING"]
        for run in stray:
            self.client.set_tag(run.info.run_id, "failure", "error")
            self.client.set_tag(run.info.run_id, "failure_reason", "the job ended without closing its run")
            self.client.set_terminated(run.info.run_id, status="FAILED")
        return bool(stray)

    def _close(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.client.set_terminated(self.record.parent_run_id, status=status)
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.previous_sigterm = None

    def _abort(self) -> None:
        if not self.closed:
            self.client.set_tag(self.record.parent_run_id, "failure", "aborted")
            self.client.set_tag(self.record.parent_run_id, "failure_reason",
                                "the sweep process exited before its end (interrupted or crashed)")
            self._close("FAILED")


def job_sweep_tags() -> dict[str, str]:
    """Inside a multirun job: the tags attaching its run to the sweep's parent ({} if none)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    record = SweepRecord.load(job_sweep_dir(hc))
    if record is None:  # the callback was removed from hydra.callbacks: plain, unparented runs
        print(f"warning: no {RECORD} in the sweep dir; this cell's run has no parent", file=sys.stderr)
        return {}
    return record.child_tags(list(hc.overrides.task), int(hc.job.num))
