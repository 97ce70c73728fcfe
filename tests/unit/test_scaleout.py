"""Scale-out: trainer presets, rank sharding, rank guards, DDP on CPU (gloo), multirun + DDP with the
basic and joblib launchers, submitit's local launcher, torch.compile."""

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from harness.config.check import check
from harness.config.load import load
from harness.errors import ConfigError
from harness.record.run import TrackedRun
from harness.scaleout import BatchGeometry, rank_command
from tests.helpers import DDP_CPU, ROOT, TINY, compose

# ---------------------------------------------------------------- presets and arithmetic


@pytest.mark.parametrize(
    "overrides, accelerator, precision, strategy",
    [
        (["trainer=cpu"], "cpu", "32-true", None),
        (["trainer=gpu"], "gpu", "bf16-mixed", None),
        (["trainer=ddp"], "gpu", "bf16-mixed", "ddp"),
        (DDP_CPU, "cpu", "32-true", "ddp"),  # fp32 on CPU: it must match a single-process run
    ],
)
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
    assert scale.params() == {
        "train.world_size": "4",
        "train.effective_batch": "96",
        "train.effective_lr": "0.001",
        "train.lr_scaling": "none",
    }


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.num_nodes=0", "trainer.num_nodes=0"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0"),
        ("trainer.devices=0", "trainer.devices=0"),
        ("trainer.strategy=ddp_spawn", "trainer.strategy=ddp_spawn: .* use trainer.strategy=ddp"),
        ("trainer.strategy=ddp_fork", "trainer.strategy=ddp_fork: .* use trainer.strategy=ddp"),
    ],
)
def test_bad_trainer_settings_are_one_line_errors(override, needle):
    with pytest.raises(ConfigError, match=needle):
        check_trainer([*DDP_CPU, override])


def check_trainer(overrides: list[str]) -> None:
    """The checks of a loaded config (trainer settings are typed by load, the device checked by check)."""
    check(load([*TINY, *overrides]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_gpu_preset_without_cuda_names_the_fix():
    with pytest.raises(ConfigError, match="no CUDA device.*trainer.accelerator=cpu"):
        check_trainer(["trainer=gpu"])


# ---------------------------------------------------------------- sharding


def _rank_loaders(dataset, batch: int, world: int, train: bool, start: int = 0) -> list[DataLoader]:
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

    from harness.data.windows import ContinueFrom

    def sampler(r):
        return (
            ContinueFrom(dataset, start, r, world)
            if train
            else UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=r, shuffle=False)
        )

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
    assert cmd[2:] == [
        "--config-name=config",
        "pos=rope",
        "trainer=ddp",
        "resume=false",  # a new run on every rank, whatever the sweep's resume=auto finds
        'hydra.run.dir="/sweep/3"',
        "hydra.output_subdir=null",
    ]
    resumed = rank_command(["pos=rope", "resume=auto"], "/sweep/3", None, Path("/ck/ab12/step-4.ckpt"))
    assert resumed[2:4] == ["pos=rope", "resume=auto"]
    assert resumed[4] == 'resume="/ck/ab12/step-4.ckpt"'  # the checkpoint rank 0 resumes from; the last value wins


def test_validation_counts_optimizer_steps_when_gradients_accumulate(train_tiny):
    """trainer.val_check_interval is in optimizer steps (harness/config/spec.py) whatever
    trainer.accumulate_grad_batches is; Lightning counts batches, so the harness converts."""
    summary, client = train_tiny(
        "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.accumulate_grad_batches=3"
    )
    assert summary.step == 4
    assert [m.step for m in client.get_metric_history(summary.run_id, "val/loss")] == [2, 4]


def test_a_fraction_of_the_epoch_validates_at_that_share_of_the_steps(train_tiny):
    """trainer.val_check_interval=0.5 is half the run's one epoch (max_steps optimizer steps): Lightning takes no
    fraction without check_val_every_n_epoch, which posbench leaves null, so the harness gives it the steps."""
    summary, client = train_tiny(
        "trainer.max_steps=4", "trainer.val_check_interval=0.5", "trainer.accumulate_grad_batches=3"
    )
    assert summary.step == 4
    assert [m.step for m in client.get_metric_history(summary.run_id, "val/loss")] == [2, 4]


def test_train_loss_is_the_mean_over_an_optimizer_steps_micro_batches(train_tiny, monkeypatch):
    """With trainer.accumulate_grad_batches=2, train/loss at step k is the mean of step k's two micro-batch
    losses (the loss its gradient is of), not the last micro-batch's alone."""
    from harness.model import module

    means, summed_loss = [], module.summed_loss

    def spy(model, batch):
        loss_sum, n = summed_loss(model, batch)
        means.append((loss_sum / n).item())
        return loss_sum, n

    monkeypatch.setattr(module, "summed_loss", spy)
    summary, client = train_tiny("trainer.max_steps=3", "trainer.accumulate_grad_batches=2")
    logged = sorted((m.step, m.value) for m in client.get_metric_history(summary.run_id, "train/loss"))
    want = [(k + 1, (means[2 * k] + means[2 * k + 1]) / 2) for k in range(3)]
    assert [s for s, _ in logged] == [s for s, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(logged, want, strict=True)) <= 1e-6


def test_a_resumed_runs_first_step_is_left_out_of_tokens_per_s_as_a_new_runs_is():
    """train/tokens_per_s leaves out the process's first optimizer step (warm-up): resumed at step 4, step 5."""
    from types import SimpleNamespace

    from harness.model.module import Throughput

    for start in (0, 4):
        meter, trainer = Throughput(every=100), SimpleNamespace(global_step=start, max_steps=10, world_size=1)
        batch = {"input_ids": torch.zeros(8, 32)}
        for _ in range(3):
            meter.on_train_batch_start(trainer, None, batch, 0)
            trainer.global_step += 1
            meter.on_train_batch_end(trainer, None, None, batch, 0)
        assert meter.total_tokens == 2 * 256, start  # 2 of the 3 steps counted


def test_tokens_per_s_under_gradient_accumulation_is_one_window_of_whole_steps(monkeypatch):
    """trainer.accumulate_grad_batches=2, logged every 2 steps: one train/tokens_per_s per logging step, over every
    micro-batch since the last (docs/logging.md: tokens ÷ time inside training steps, the first step left out).
    Micro-batch i takes i + 1 seconds, so each window's rate names the micro-batches in it."""
    from types import SimpleNamespace

    from harness.model import module

    times = iter(t for i in range(12) for t in (10.0 * i, 10.0 * i + i + 1))
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: next(times)))
    meter, trainer = module.Throughput(every=2), SimpleNamespace(global_step=0, max_steps=6, world_size=1)
    logged: list[tuple[int, float]] = []
    log = SimpleNamespace(log=lambda key, value: logged.append((trainer.global_step, value)))
    batch = {"input_ids": torch.zeros(8, 32)}
    for i in range(12):
        meter.on_train_batch_start(trainer, log, batch, i)
        trainer.global_step += i % 2  # the second micro-batch ends the optimizer step
        meter.on_train_batch_end(trainer, log, None, batch, i)
    assert logged == [(2, 512 / (3 + 4)), (4, 1024 / (5 + 6 + 7 + 8)), (6, 1024 / (9 + 10 + 11 + 12))]
    assert meter.total_tokens == 10 * 256  # every micro-batch but step 1's two


def test_a_process_that_trains_no_step_reports_no_tokens_per_s():
    """resume=true from the checkpoint of the last step (a run stopped in its final evaluation) trains nothing:
    the summary says there is no throughput instead of 0 tokens/s."""
    from dataclasses import replace

    from harness.model.module import Throughput
    from harness.train import Summary, format_summary

    assert Throughput().mean is None
    s = Summary("r", "pos=x", "sqlite:///m.db", "e", 2.0, None, 300, 1000.0, 10, 1.0, 0.8, 0.05)
    assert "train tokens/s   1,000\n" in format_summary(s)
    said = format_summary(replace(s, tokens_per_s=None))
    assert "train tokens/s   n/a (no training step in this process)\n" in said
