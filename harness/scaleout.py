"""Scale-out: the batch geometry of a step, rank-zero printing, and DDP inside a Hydra multirun.

With ``strategy: ddp`` Lightning reruns the whole script once per extra local rank, so
everything with a side effect outside the process (the MLflow run, printing the summary)
happens on global rank 0 only: ``TrackedRun`` is inert elsewhere (harness/record/run.py).

Multirun + DDP: Lightning's launcher relaunches ranks with the original argv, so rank 1 of
a ``-m`` job would run its own whole sweep, and the next job would find the process group
and the rank env vars of the last one. ``job_ranks`` starts the extra local ranks itself,
each as a single run of *this job's* overrides into this job's output dir, through the
contract Lightning documents for external launchers (``LightningEnvironment``: a process
that sees LOCAL_RANK is one rank of a group someone else started), and undoes all of it
after the job. Nothing here imports torch or lightning at module level (import cost).

May import: the ground only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from harness.errors import ConfigError
from harness.paths import ROOT, in_checkout

# What a DDP job leaves behind in the process environment (Lightning's subprocess launcher and
# seed_everything set these, plus OMP_NUM_THREADS when it was unset): restored after each job.
RANK_ENV = (
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "RANK",
    "OMP_NUM_THREADS",
    "PL_GLOBAL_SEED",
    "PL_SEED_WORKERS",
)
# How long the other ranks may take to finish after rank 0 has (they end together normally).
RANK_EXIT_GRACE_S = 60.0


@dataclass
class BatchGeometry:
    """How one optimizer step's batch is made: per-device batch × accumulation × world size."""

    batch_size: int  # per device, per forward (data.batch_size)
    accumulate: int  # trainer.accumulate_grad_batches
    world_size: int  # devices × nodes
    lr: float

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.accumulate * self.world_size

    def params(self) -> dict[str, str]:
        # The lr is used as configured on every device count (no linear scaling rule): to compare
        # runs at different effective batches, set optim.optimizer.lr yourself.
        return {
            "train.world_size": str(self.world_size),
            "train.effective_batch": str(self.effective_batch),
            "train.effective_lr": str(self.lr),
            "train.lr_scaling": "none",
        }


# ---------------------------------------------------------------- rank guards


def is_rank_zero() -> bool:
    """Global rank 0, as Lightning knows it: from RANK / LOCAL_RANK / SLURM_PROCID at import, then
    from the Trainer once one is built."""
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0  # type: ignore[attr-defined]  # lightning sets .rank on the function at import


def rank_zero_print(text: str) -> None:
    if is_rank_zero():
        print(text)


# ---------------------------------------------------------------- multirun + DDP


@contextmanager
def job_ranks(trainer, ckpt: Path | None) -> Iterator[None]:
    """Inside a Hydra multirun job with several local DDP processes: start ranks 1..N-1 as single
    runs of this job, resuming from ``ckpt`` as this rank does, then, whatever happens, reap them and
    restore the process's DDP state."""
    if not _needs_own_ranks(trainer):
        yield
        return
    import torch

    saved_env, saved_threads = dict(os.environ), torch.get_num_threads()
    procs: list[subprocess.Popen] = []
    try:
        procs = _start_ranks(trainer, ckpt)
        yield
    except BaseException:
        _destroy_process_group()  # closes the sockets the other ranks wait on: they fail now, not at timeout
        raise
    finally:
        _reap(procs)
        _destroy_process_group()
        for key in RANK_ENV:
            os.environ.pop(key, None)
        os.environ.update({key: saved_env[key] for key in RANK_ENV if key in saved_env})
        torch.set_num_threads(saved_threads)  # Lightning divides the cores among the ranks


def _needs_own_ranks(trainer) -> bool:
    """A multirun job whose strategy would relaunch this script per local rank (ddp, not
    ddp_spawn, not SLURM/torchrun, which start every rank themselves)."""
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    launcher = trainer.strategy.launcher
    return (
        trainer.num_devices > 1
        and isinstance(launcher, _SubprocessScriptLauncher)
        and not launcher.cluster_environment.creates_processes_externally
        and HydraConfig.initialized()
        and HydraConfig.get().mode == RunMode.MULTIRUN
    )


def _start_ranks(trainer, ckpt: Path | None) -> list[subprocess.Popen]:
    hc = HydraConfig.get()
    if trainer.num_nodes > 1:  # the user started this on every node and says where rank 0 listens
        if not {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK"} <= os.environ.keys():
            raise ConfigError(
                "trainer.num_nodes > 1 outside SLURM needs MASTER_ADDR, MASTER_PORT and NODE_RANK "
                "set on every node; or use hydra/launcher=slurm"
            )
    else:  # a fresh port per job: concurrent jobs (joblib) must not meet on one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), NODE_RANK="0")
    os.environ["WORLD_SIZE"] = str(trainer.num_devices * trainer.num_nodes)
    os.environ["LOCAL_RANK"] = "0"  # from here Lightning treats the ranks as started externally
    command = rank_command(list(hc.overrides.task), hc.runtime.output_dir, hc.job.config_name, ckpt)
    return [
        subprocess.Popen(
            [*command, f"hydra.job.name=ddp_rank_{r}"], cwd=hc.runtime.cwd, env={**os.environ, "LOCAL_RANK": str(r)}
        )
        for r in range(1, trainer.num_devices)
    ]


def rank_command(
    task_overrides: list[str], output_dir: str, config_name: str | None, ckpt: Path | None = None
) -> list[str]:
    """``python run.py <the job's own overrides>`` as a single run into the job's output dir (not
    the sweep's argv, which sys.argv still holds in-process and a joblib worker does not hold at all).
    ``ckpt``: the checkpoint rank 0 resumes from (a sweep cell decides that in rank 0, as ``resume=auto``),
    else none: every rank starts from the same step, optimizer state and example."""
    entry = [str(ROOT / "run.py")] if in_checkout() else ["-m", "harness.main"]  # installed: posbench's module
    return [
        sys.executable,
        *entry,
        *([f"--config-name={config_name}"] if config_name else []),
        *task_overrides,
        f'resume="{ckpt}"' if ckpt else "resume=false",
        f'hydra.run.dir="{output_dir}"',  # quoted: any path parses
        "hydra.output_subdir=null",
    ]  # rank 0 wrote the job's .hydra/


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reap(procs: list[subprocess.Popen]) -> None:
    """Ranks end with rank 0 on success; after a failure on rank 0 they may wait in a collective
    forever, so they get a grace period and are then killed."""
    for proc in procs:
        try:
            proc.wait(timeout=RANK_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode:
            print(f"warning: DDP rank process {proc.pid} exited with {proc.returncode}", file=sys.stderr)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
