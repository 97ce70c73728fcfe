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
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness import integrity
from harness.config.load import claim_comparisons, preset_axes
from harness.errors import MachineFault, write_failure
from harness.record.run import TrackedRun, alive, close_dead_runs, git_sha, mark_failed, terminate
from harness.record.store import dashboard_command, dashboard_url, resolve_tracking_uri
from harness.signals import SWEEP_PID, Stopped, stopped
from harness.signals import exit_code as stop_code
from results.cells import ALPHA_TAG, BASELINE_TAG, GAIN_TAG, MARGIN_TAG, STAGES_TAG

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
        integrity.write(sweep_dir / RECORD, asdict(self))

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepRecord | None:
        return integrity.read_fields(
            sweep_dir / RECORD,
            cls,
            "start the sweep again in a new hydra.sweep.dir (this record ties its jobs to their parent run)",
        )

    def child_tags(self, job_overrides: list[str], job_num: int) -> dict[str, str]:
        parsed = OverridesParser.create().parse_overrides(job_overrides)
        cell = " ".join(str(o.input_line) for o in parsed if o.get_key_element() in self.swept_keys)
        return {
            "mlflow.parentRunId": self.parent_run_id,
            "sweep_id": self.sweep_id,
            "sweep_cell": cell,
            "sweep_job": str(job_num),
        }


# ---------------------------------------------------------------- the launching side


def sweep_name(task_overrides: list[str]) -> tuple[str, list[str]]:
    """``sweep pos=rope,t5 attn=performer`` from the sweep's overrides, and the swept keys."""
    parsed = OverridesParser.create().parse_overrides(task_overrides)
    swept = [o for o in parsed if o.is_sweep_override()]
    shown = swept or parsed  # `-m` over single values: name it by all its overrides
    return "sweep " + (" ".join(str(o.input_line) for o in shown) or "(defaults)"), [o.get_key_element() for o in swept]


def _stages(config: DictConfig) -> str:
    """``stage,max_seeds,spending`` under report.seeds=auto (``,claim`` where it decides by the preset's claim),
    else ""."""
    if OmegaConf.select(config, "report.seeds") != "auto":
        return ""
    design = [str(OmegaConf.select(config, f"report.{key}")) for key in ("stage", "max_seeds", "spending")]
    return ",".join([*design, *(["claim"] if claim_comparisons(config) else [])])


def exit_code(statuses: list[str]) -> int:
    if any(s not in OK_STATUSES for s in statuses):
        return 1
    return 0 if "finished" in statuses else 2  # 2: nothing trained, like a single run with a bad config


class MlflowSweep(Callback):
    """Registered under ``hydra.callbacks`` (conf/config.yaml); active only for ``-m``. Owns the
    sweep's parent run (a ``TrackedRun``) from the first job to the report."""

    def __init__(self) -> None:
        self.parent: TrackedRun | None = None
        self.record: SweepRecord | None = None
        self.previous_sigterm: Callable[[int, FrameType | None], object] | int | None = None  # signal.signal's

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        # Hydra turns a callback's exception into a warning and carries on; a sweep without
        # its parent would scatter orphan runs, so stop here with a one-line error instead.
        try:
            self._start(config)
        except Exception as e:
            print(
                f"error: cannot create the sweep's MLflow parent run ({type(e).__name__}: {e}); "
                "check logger.tracking_uri or $MLFLOW_TRACKING_URI",
                file=sys.stderr,
            )
            sys.exit(2)

    def _start(self, config: DictConfig) -> None:
        overrides = list(config.hydra.overrides.task)
        # a preset's own axes (hydra.sweeper.params) are swept too, unless the command line pins them
        axes = preset_axes(config.hydra.sweeper.get("params"), overrides)
        staged = OmegaConf.select(config, "report.seeds") == "auto"  # the sweeper's looks replace a preset's seeds
        name, swept = sweep_name(overrides + [f"{k}={v}" for k, v in axes.items() if not (staged and k == "seed")])
        swept += ["seed"] if staged else []  # the sweeper adds it
        uri = resolve_tracking_uri(config.logger.tracking_uri)
        sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        self.parent = TrackedRun(uri, config.logger.experiment, name)
        self.parent.start(
            {
                "sweep_role": "parent",
                "sweep_id": sweep_id,
                "sweep_dir": str(sweep_dir),
                "sweep_overrides": " ".join(overrides)[:5000],
                "git_sha": git_sha(),
                # the launcher (e.g. hydra/launcher=joblib hydra.launcher.n_jobs=2): what the wall time means
                "hydra_overrides": " ".join(config.hydra.overrides.hydra)[:5000],
                # the comparison, declared before any cell trains (results/verdicts.py reads it back)
                BASELINE_TAG: str(OmegaConf.select(config, "report.baseline") or ""),
                ALPHA_TAG: str(OmegaConf.select(config, "report.alpha") or ""),
                MARGIN_TAG: str(OmegaConf.select(config, "report.margin") or ""),
                GAIN_TAG: str(OmegaConf.select(config, "report.min_order_gain", default="")),  # 0 is a threshold
                # report.seeds=auto: the design its looks were judged by, for the report to replay them
                STAGES_TAG: _stages(config),
            },
            {},
        )
        assert self.parent.run_id is not None, "start creates the run or raises"
        close_dead_runs(self.parent.store, config.logger.experiment, keep=self.parent.run_id)  # killed earlier
        self.record = SweepRecord(self.parent.run_id, sweep_id, uri, config.logger.experiment, swept)
        atexit.register(self._abort)  # no parent left RUNNING if the sweep dies before its end
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # SIGTERM would skip atexit
            self.previous_sigterm = signal.signal(signal.SIGTERM, _stop)
        self.record.save(sweep_dir)
        os.environ[SWEEP_PID] = str(os.getpid())  # a worker it launches stops once it is gone (signals.py)
        print(f"sweep {sweep_id}: MLflow parent run {self.parent.run_id} ({name!r})")

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.record is None or self.parent is None:
            return
        code = 1
        try:
            code = self._finish(config, self.parent, self.record)
        except Exception:
            traceback.print_exc()
            print("error: the sweep's report failed (above); its cells are in MLflow", file=sys.stderr)
        except BaseException as e:  # SIGTERM or Ctrl-C while the report is made
            if stop_code(e) is not None:
                self._close("KILLED", "stopped while making the report; python -m results report rebuilds it")
            raise
        finally:
            self._close("FINISHED" if code == 0 else "FAILED")
        if code:
            sys.exit(code)  # after all cells ran; Hydra's own exit would be 0

    def _finish(self, config: DictConfig, parent: TrackedRun, record: SweepRecord) -> int:
        from results.report import console_summary, headline_metrics, write_report
        from results.store import find_sweep, sweep_report

        client = parent.store.client
        sweep = find_sweep(client, record.experiment, record.sweep_id)
        stray = [run.info.run_id for run in sweep.runs if run.info.status == "RUNNING"]
        for run_id in stray:  # a job killed hard (e.g. an OOM-killed worker) left its run RUNNING
            mark_failed(parent.store, run_id, "error", "the job ended without closing its run")
        if stray:
            sweep = find_sweep(client, record.experiment, record.sweep_id)
        report = sweep_report(client, sweep, OmegaConf.select(config, "report.target_loss"))
        # the baseline and order-gain threshold are those the parent run recorded when the sweep started (sweep_report
        # reads them there)
        code = exit_code([c.status for c in report.cells])
        print(f"\n{sweep.title} · {len(report.cells)} cells · exit {code}\n{console_summary(report)}\n")
        parent.log_scalars(headline_metrics(report.cells), 0)  # numbers on the parent's row of the runs table
        with tempfile.TemporaryDirectory() as tmp:
            with integrity.report_folder(Path(tmp) / "report") as staging:
                write_report(report, staging)
            parent.log_dir(str(Path(tmp) / "report"))
            # the run description is rendered on the parent's page in the MLflow UI
            parent.set_tags({"mlflow.note.content": (Path(tmp) / "report" / "report.md").read_text()})
        print(f"report: artifacts of MLflow run {parent.run_id} (experiment '{record.experiment}')")
        print(dashboard(record, sweep.experiment_id))
        return code

    def _close(self, status: str, reason: str | None = None) -> None:
        if self.parent is None or self.parent.closed:
            return
        self.parent.end(status, {"failure": "aborted", "failure_reason": reason} if reason else None)
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.previous_sigterm = None

    def _abort(self) -> None:
        try:
            if stopped():  # SIGTERM or Ctrl-C (harness/signals.py): the sweep was stopped, not broken
                self._stop_cells()
                self._close("KILLED", "stopped by a signal; run the same command again: finished cells are kept")
            elif MachineFault.seen:
                self._close(
                    "FAILED",
                    f"writing failed: {MachineFault.seen}; run the same command again once there "
                    "is room: finished cells are kept",
                )
            else:
                self._close("FAILED", "the sweep process exited before its end (crashed)")
        except Exception as e:
            if write_failure(e) is None:
                raise
            # the store cannot be written either: the parent stays RUNNING until the next sweep in this
            # experiment closes it (close_dead_runs); the one line was printed where the write first failed

    def _stop_cells(self, grace_s: float = 20.0) -> None:
        """A stopped sweep stops its cells: a launcher's worker (joblib, submitit) does not see the signal sent
        to the sweep's process. A cell still RUNNING whose process lives on this host is sent SIGTERM and
        closes itself KILLED with its checkpoint, as a stopped run does; one whose process is gone (the
        launcher tore its workers down) is closed KILLED here, so no cell is left RUNNING."""
        if self.parent is None or self.record is None:
            return
        store, host = self.parent.store, socket.gethostname()
        where = f"tags.sweep_id = '{self.record.sweep_id}' and attributes.status = 'RUNNING'"
        try:
            pids = {  # the cells' processes on this host, other than this one
                int(r.data.tags["pid"])
                for r in store.search(self.record.experiment, where)
                if r.info.run_id != self.parent.run_id
                and r.data.tags.get("host") == host
                and r.data.tags.get("pid", "").isdigit()
            } - {os.getpid()}
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.2)
            for run in store.search(self.record.experiment, where):
                if run.info.run_id != self.parent.run_id:
                    store.client.set_tag(
                        run.info.run_id,
                        "failure_reason",
                        "its sweep was stopped by a signal; run the sweep's command again: finished cells are kept",
                    )
                    terminate(store, run.info.run_id, "KILLED")
        except Exception as e:  # the parent is closed KILLED all the same; a later start reconciles the cells
            print(f"warning: could not close the sweep's cells ({type(e).__name__}: {e})", file=sys.stderr)


def _stop(signum, frame) -> None:
    """SIGTERM in the sweep's own process between cells: a stop (exit 143, the parent KILLED)."""
    raise Stopped(128 + signum)


def job_sweep_tags() -> dict[str, str]:
    """Inside a multirun job: the tags attaching its run to the sweep's parent ({} if none)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    # the sweep dir as the launcher made it, from the job's own output dir (robust to hydra.job.chdir)
    out = Path(hc.runtime.output_dir)  # absolute: <sweep.dir>/<sweep.subdir>
    depth = len(Path(str(hc.sweep.subdir)).parts)
    record = SweepRecord.load(out.parents[depth - 1] if depth else out)
    if record is None:  # the callback was removed from hydra.callbacks: plain, unparented runs
        print(f"warning: no {RECORD} in the sweep dir; this cell's run has no parent", file=sys.stderr)
        return {}
    return record.child_tags(list(hc.overrides.task), int(hc.job.num))


def dashboard(record: SweepRecord, experiment_id: str) -> str:
    """The command that serves the UI, and the pages of exactly this sweep: its cells and its parent."""
    return "\n".join(
        [
            f"dashboard:  {dashboard_command(record.tracking_uri)}",
            f"  cells:    {dashboard_url(experiment_id, search=f'tags.sweep_id = {record.sweep_id!r}')}",
            f"  report:   {dashboard_url(experiment_id, record.parent_run_id)}",
        ]
    )
