"""Scale-out: trainer presets, rank sharding, rank guards, DDP on CPU (gloo), multirun + DDP with the
basic and joblib launchers, submitit's local launcher, torch.compile."""

import os
import subprocess
import sys
import time

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import DataLoader

from harness.config.validate import validate
from harness.errors import ConfigError
from harness.record.run import TrackedRun
from harness.scaleout import BatchGeometry, rank_command
from tests.helpers import ROOT, TINY, choices_of, compose, run_sweep

DDP_CPU = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


# ---------------------------------------------------------------- presets and arithmetic


@pytest.mark.parametrize("overrides, accelerator, precision, strategy", [
    (["trainer=cpu"], "cpu", "32-true", None),
    (["trainer=gpu"], "gpu", "bf16-mixed", None),
    (["trainer=ddp"], "gpu", "bf16-mixed", "ddp"),
    (DDP_CPU, "cpu", "32-true", "ddp"),  # fp32 on CPU: it must match a single-process run
])
def test_trainer_presets(overrides, accelerator, precision, strategy):
    trainer = compose(overrides).trainer
    assert (trainer.accelerator, trainer.precision, trainer.get("strategy")) == (accelerator, precision, strategy)


def test_slurm_preset_follows_the_trainer():
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"]
    launcher = compose(overrides).hydra.launcher
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (4, 4, 2)
    assert launcher.max_num_timeout > 0 and launcher._target_.endswith("SlurmLauncher")


def test_effective_batch_and_lr_are_logged_unscaled():
    scale = BatchGeometry(batch_size=8, accumulate=3, world_size=4, lr=1e-3)
    assert scale.effective_batch == 96
    assert scale.train_examples(max_steps=10) == 960  # every rank reads max_steps × batch × accumulate
    assert scale.params() == {"train.world_size": "4", "train.effective_batch": "96",
                              "train.effective_lr": "0.001", "train.lr_scaling": "none"}


@pytest.mark.parametrize("override, needle", [
    ("trainer.num_nodes=0", "trainer.num_nodes=0"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0"),
    ("trainer.devices=0", "trainer.devices=0"),
])
def test_bad_trainer_settings_are_one_line_errors(override, needle):
    with pytest.raises(ConfigError, match=needle):
        check_trainer([*DDP_CPU, override])


def check_trainer(overrides: list[str]) -> None:
    """The validation pass over a composed config (trainer settings are checked there)."""
    from omegaconf import open_dict

    cfg = compose([*TINY, *overrides])
    choices = choices_of(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    validate(cfg, choices)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_gpu_preset_without_cuda_names_the_fix():
    with pytest.raises(ConfigError, match="no CUDA device.*trainer.accelerator=cpu"):
        check_trainer(["trainer=gpu"])


# ---------------------------------------------------------------- sharding


def _rank_loaders(dataset, batch: int, world: int, train: bool, start: int = 0) -> list[DataLoader]:
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

    from harness.data.windows import ContinueFrom

    def sampler(r):
        return (ContinueFrom(dataset, start, r, world) if train else
                UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=r, shuffle=False))

    return [DataLoader(dataset, batch_size=batch, sampler=sampler(r)) for r in range(world)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_global_batch_holds_the_single_process_examples(accumulate):
    """Optimizer step k of 2 ranks × batch 4 reads the same examples as 1 process × batch 8."""
    dataset, world, batch = list(range(48)), 2, 4
    single = [b.tolist() for b in DataLoader(dataset, batch_size=batch * world)]
    per_rank = [[b.tolist() for b in loader] for loader in _rank_loaders(dataset, batch, world, train=True)]
    for step in range(len(single) // accumulate):
        micro = range(step * accumulate, (step + 1) * accumulate)
        ddp = sorted(i for rank in per_rank for m in micro for i in rank[m])
        assert ddp == sorted(i for m in micro for i in single[m])


def test_resumed_ranks_continue_where_the_global_batch_stopped():
    """After 2 optimizer steps of 2 ranks × batch 4, the ranks go on with examples 16, 17, …"""
    dataset, world, batch = list(range(48)), 2, 4
    per_rank = [[b.tolist() for b in loader] for loader in _rank_loaders(dataset, batch, world, True, start=16)]
    assert per_rank[0][0] == [16, 18, 20, 22] and per_rank[1][0] == [17, 19, 21, 23]


def test_validation_shards_cover_every_window_once():
    dataset = list(range(37))  # not a multiple of the world size: no padding repeats
    seen = [i for loader in _rank_loaders(dataset, 4, 3, train=False) for b in loader for i in b.tolist()]
    assert sorted(seen) == dataset


# ---------------------------------------------------------------- rank guards and the relaunch command


def test_other_ranks_get_a_no_op_client_and_no_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'never-created.db'}"  # the store is not even opened on other ranks
    run = TrackedRun(uri, "posbench", "pos=rope attn=softmax seed=0")
    with run.open({"pos": "rope"}, {"seed": "0"}, owner=False) as opened:
        assert opened.run_id is None and not opened.opened
        assert opened.log_params({"a": "1"}) is None and opened.set_tags({"b": "2"}) is None
    assert not (tmp_path / "never-created.db").exists()


def test_rank_command_is_a_single_run_of_the_job():
    cmd = rank_command(["pos=rope", "trainer=ddp"], "/sweep/3", "config")
    assert cmd[:2] == [sys.executable, str(ROOT / "run.py")]
    assert "-m" not in cmd and "--multirun" not in cmd
    assert cmd[2:] == ["--config-name=config", "pos=rope", "trainer=ddp", 'hydra.run.dir="/sweep/3"',
                       "hydra.output_subdir=null"]


# ---------------------------------------------------------------- end to end (subprocesses)


def _run_py(tmp_path, *args, timeout=300):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "run.py", *TINY, "model.dropout=0", *args,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    return proc, client, client.search_runs([client.get_experiment_by_name("posbench").experiment_id])


def _curve(client, run, metric):
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, metric)}


# Tolerance of the DDP-vs-single comparison. The global batch holds the same examples in the same
# order (rank_sampler), dropout is 0, the masks are functions of (seed, index), and each rank divides
# its loss sum by the *global* masked-token count, so DDP's gradient average is the single-process
# gradient: what remains is float32 summation order (two partial sums plus an all-reduce, DDP's
# bucketed gradient average), measured at <= 5e-7 over 6 steps. 1e-4 leaves room for Adam's
# amplification of tiny gradient differences and still fails when the examples differ (a shuffled
# sampler: 4e-3 to 5e-2) or when ranks normalise by their own token count (measured 2e-3 train, 6e-4 val).
DDP_TOLERANCE = 1e-4


@pytest.mark.slow
def test_ddp_on_cpu_logs_one_run_matching_a_single_process(tmp_path):
    ddp_out, ddp_client, ddp_runs = _run_py(tmp_path / "ddp", *DDP_CPU)
    assert [r.info.status for r in ddp_runs] == ["FINISHED"]  # rank 1 logged nothing
    assert ddp_out.stdout.count("final val loss") == 1  # the summary prints on rank 0 only
    [run] = ddp_runs
    assert (run.data.params["train.world_size"], run.data.params["train.effective_batch"]) == ("2", "16")

    _, one_client, [single] = _run_py(tmp_path / "one", "data.batch_size=16")  # the same global batch
    assert single.data.params["train.effective_batch"] == "16"
    for metric in ("train/loss", "val/loss"):
        ddp, one = _curve(ddp_client, run, metric), _curve(one_client, single, metric)
        assert ddp.keys() == one.keys() and len(ddp) >= 2
        diff = max(abs(ddp[s] - one[s]) for s in ddp)
        assert diff < DDP_TOLERANCE, f"{metric}: DDP and single process differ by {diff:.2e}"


def _assert_one_parent_two_finished_children(sweep):
    assert sweep.proc.returncode == 0, sweep.proc.stderr[-3000:]
    assert sweep.parent is not None and sweep.parent.info.status == "FINISHED"
    assert sorted(r.data.tags["pos"] for r in sweep.children) == ["learned", "rope"]
    assert {r.info.status for r in sweep.children} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in sweep.children} == {sweep.parent.info.run_id}
    assert sorted(p.name for p in sweep.sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]


# Sweeps of DDP jobs and the submitit launcher cost ~2 min together on 2 cores, a sixth of the suite:
# opt-in (POSBENCH_TEST_LAUNCHERS=1), as torch.compile below. DDP itself stays in every run (the test above).
LAUNCHERS = pytest.mark.skipif(not os.environ.get("POSBENCH_TEST_LAUNCHERS"),
                               reason="DDP sweeps, submitit: ~2 min on 2 cores; POSBENCH_TEST_LAUNCHERS=1 runs them")


@pytest.mark.slow
@LAUNCHERS
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
                         ids=["basic", "joblib"])
def test_multirun_with_ddp(launcher, tmp_path):
    """2 cells × 2 ranks: each rank 1 runs its own cell once, not the sweep; the second job gets a
    fresh process group."""
    before = set((ROOT / "multirun").glob("*/*")) if (ROOT / "multirun").exists() else set()
    sweep = run_sweep(tmp_path, "pos=rope,learned", *DDP_CPU, *launcher)
    _assert_one_parent_two_finished_children(sweep)
    for job in ("0", "1"):  # rank 1 wrote its log into its own job's dir
        assert (sweep.sweep_dir / job / "ddp_rank_1.log").exists()
    after = set((ROOT / "multirun").glob("*/*")) if (ROOT / "multirun").exists() else set()
    assert after == before, "a rank started a sweep of its own"
    assert {r.data.params["train.world_size"] for r in sweep.children} == {"2"}


@pytest.mark.slow
@LAUNCHERS
def test_submitit_local_multirun(tmp_path, monkeypatch):
    """submitit pickles each job and runs it in a fresh process: the job still finds its parent run
    through <sweep dir>/mlflow_sweep.json."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two jobs at once on 2 cores: no spinning thread pools
    sweep = run_sweep(tmp_path, "pos=rope,learned", "hydra/launcher=submitit_local")
    _assert_one_parent_two_finished_children(sweep)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("POSBENCH_TEST_COMPILE"),
                    reason="torch.compile of a 2-step run took 102 s on 2 busy cores; POSBENCH_TEST_COMPILE=1 runs it")
def test_compiled_model_trains(train_tiny):
    started = time.perf_counter()
    summary, client = train_tiny("model.compile=true", "trainer.max_steps=2", "trainer.val_check_interval=2")
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.compile"] == "True"
    assert torch.isfinite(torch.tensor(summary.val_loss))
    print(f"compiled 2-step run: {time.perf_counter() - started:.0f} s")
