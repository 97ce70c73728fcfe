"""Positional phases (``phases``): a run changes its scheme, its scaling or its training length at stated steps.
The state at a step by the rules, the model after a boundary against a model built that way, bad phases refused
in one line, the boundaries read back from MLflow, and a run killed past a boundary resumed exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest
import torch

from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.phases import Phase, PhaseState, PositionPhases, describe, state_at
from harness.model.transformer import ModelConfig, Transformer
from positional.none import NoPosition
from positional.rope import Rope
from tests.helpers import ROOT, TINY


def test_the_state_at_a_step_carries_what_a_phase_leaves_out():
    """A phase's keys last until another sets them; a new scheme drops the scaling."""
    rope = lambda shape: Rope(shape)  # noqa: E731
    phases = [Phase(10, "scaling=yarn", scaling="yarn", factor=2.0), Phase(20, "seq_len=16", seq_len=16),
              Phase(30, "pos=rope", pos=rope), Phase(40, "scaling=linear", scaling="linear", factor=4.0)]
    assert state_at(phases, 9) == state_at([], 0) == PhaseState(-1, -1, None, None)
    assert state_at(phases, 10) == PhaseState(0, -1, ("yarn", 2.0), None)
    assert state_at(phases, 25) == PhaseState(1, -1, ("yarn", 2.0), 16)
    assert state_at(phases, 30) == PhaseState(2, 2, None, 16)  # the new scheme starts unscaled; the length stays
    assert state_at(phases, 10**9) == PhaseState(3, 2, ("linear", 4.0), 16)
    assert describe(phases[:2], "rope") == "0: pos=rope · 10: scaling=yarn · 20: seq_len=16"


def module_of(model):
    """What the callback reads of a LightningModule."""
    logged = {}
    return types.SimpleNamespace(model=model, device=torch.device("cpu"), global_step=0, scaled_in_training=False,
                                 log=lambda k, v: logged.__setitem__(k, v), logged=logged)


def tiny(pos=Rope):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_ff=64, dropout=0.0)
    return Transformer(cfg, 61, 16, True, pos, Softmax).double().eval()


def test_dropping_rope_at_a_boundary_is_the_same_weights_without_positions():
    """DroPE's step: after the boundary the model is the NoPE model with the weights it trained (bit for bit);
    before it, the RoPE model; the batch is cut to the phase's length."""
    model, module = tiny(), None
    module = module_of(model)
    callback = PositionPhases([Phase(3, "pos=none seq_len=8", pos=NoPosition, seq_len=8)])
    ids = torch.randint(61, (2, 16))
    with_rope = model(ids)
    batch = {"input_ids": ids.clone(), "labels": ids.clone(), "key_padding_mask": None}
    callback.on_train_batch_start(types.SimpleNamespace(global_step=2), module, batch, 0)
    assert isinstance(model.pos, Rope) and batch["input_ids"].shape == (2, 16) and module.logged["train/phase"] == 0
    callback.on_train_batch_start(types.SimpleNamespace(global_step=3), module, batch, 0)
    assert isinstance(model.pos, NoPosition) and module.logged["train/phase"] == 1
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 8)
    nope = tiny(NoPosition)
    nope.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(ids), nope(ids), rtol=0, atol=0)
    assert not torch.allclose(model(ids), with_rope)
    assert set(model.state_dict()) == set(tiny().state_dict())  # a checkpoint's keys in every phase


def test_a_training_time_scaling_is_in_force_in_its_phase_and_validated_with():
    """YaRN from step 4 at factor 2: the training forward is the scheme rescaled for twice the training length."""
    model = tiny().train()
    module = module_of(model)
    callback = PositionPhases([Phase(4, "scaling=yarn factor=2", scaling="yarn", factor=2.0)])
    ids = torch.randint(61, (2, 16))
    callback.on_train_batch_start(types.SimpleNamespace(global_step=4), module, {"input_ids": ids}, 0)
    assert module.scaled_in_training and model.pos.scaling.method == "yarn" and model.pos.scaling.factor == 2.0
    scaled = model(ids)
    callback.on_train_end(None, module)
    assert model.pos.scaling.method == "none" and not module.scaled_in_training
    reference = tiny().train()
    with reference.pos.rescaled("yarn", 32, in_training=True):
        torch.testing.assert_close(scaled, reference(ids), rtol=0, atol=0)


@pytest.mark.parametrize("phases, needle", [
    ("[{at:3,pso:none}]", "phases[0].pso is no phase key; use at, pos, scaling, factor, seq_len"),
    ("[{pos:none}]", "phases[0] has no 'at'"),
    ("[{at:3}]", "phases[0] changes nothing"),
    ("[{at:3,scaling:yarn}]", "phases[0]: scaling and factor go together"),
    ("[{at:3,scaling:yarn,factor:0.5}]", "phases[0].factor=0.5 must be a number > 1"),
    ("[{at:4,pos:none},{at:3,pos:rope}]", "phases[1].at=3 must lie after the previous phase's (4)"),
    ("[{at:6,pos:none}]", "phases[0].at=6 must lie after the previous phase's (0) and before trainer.max_steps=6"),
    ("[{at:3,pos:t5}]", "phases[0].pos=t5 has trained parameters"),
    ("[{at:3,pos:nope}]", "'nope', which is no phases[0].pos option"),
    ("[{at:3,pos:'rope(bse=2)'}]", "phases[0].pos: rope(bse=2) sets bse, which is not a key of pos=rope"),
    ("[{at:3,pos:none},{at:4,scaling:yarn,factor:2}]", "phases[1].scaling=yarn: the scheme in force then has no"),
    ("[{at:3,seq_len:64}]", "phases[0].seq_len=64 must lie in 2 … data.seq_len=32"),
    ("[{at:3,at2:1}]", "phases[0].at2 is no phase key"),
    ("[3]", "phases[0]=3 must be a mapping such as {at: 300, pos: none}"),
])
def test_a_bad_phase_is_refused_in_one_line(phases, needle):
    from tests.helpers import validated

    with pytest.raises(ConfigError, match=re.escape(needle)):
        validated("task=clm", f"phases={phases}")


def test_a_scheme_with_parameters_cannot_be_phased_out():
    from tests.helpers import validated

    with pytest.raises(ConfigError, match=re.escape("pos=learned, the run's own scheme has trained parameters")):
        validated("task=clm", "pos=learned", "phases=[{at:3,pos:none}]")
    with pytest.raises(ConfigError, match="per-layer pattern"):
        validated("task=clm", "+pos.layers=[rope,none]", "phases=[{at:3,pos:none}]")


# ---------------------------------------------------------------- end to end, read back from MLflow

CONSTANT = ["task=clm", "optim.schedule.decay=constant", "optim.schedule.warmup_steps=2", "model.dropout=0.0"]


@pytest.mark.slow
def test_a_drope_run_logs_its_boundary_and_trains_the_plain_runs_weights_up_to_it(train_tiny):
    """With a constant rate after warm-up, a run that drops RoPE at step 6 is, up to step 6, the plain RoPE run of
    6 steps (the same seed, the same batches): its val/loss there is that run's final one. After it train/phase
    is 1 and the final evaluation reads the model without positions."""
    plain, client = train_tiny(*CONSTANT, "trainer.max_steps=6", "trainer.val_check_interval=3")
    drope, _ = train_tiny(*CONSTANT, "trainer.max_steps=9", "trainer.val_check_interval=3",
                          "phases=[{at:6,pos:none}]", "eval.lengths=[32,64]")
    phase = sorted((m.step, m.value) for m in client.get_metric_history(drope.run_id, "train/phase"))
    assert [v for s, v in phase if s <= 6] == [0.0] * 6 and [v for s, v in phase if s > 6] == [1.0] * 3
    val = dict((m.step, m.value) for m in client.get_metric_history(drope.run_id, "val/loss"))
    assert abs(val[6] - plain.val_loss) <= 1e-6, (val[6], plain.val_loss)
    run = client.get_run(drope.run_id)
    assert run.data.tags["phases"] == "0: pos=rope · 6: pos=none" and run.info.status == "FINISHED"
    assert {"val/loss_at_32", "val/loss_at_64"} <= set(run.data.metrics)


@pytest.fixture
def float32():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.slow
def test_a_run_killed_past_a_boundary_resumes_in_its_phase(store, tmp_path, train_tiny, float32):
    """kill -9 before step 7 of 10, RoPE dropped at step 3, the last checkpoint at step 4: the resumed run trains
    steps 5-10 without RoPE and ends where the uninterrupted run does."""
    from mlflow.tracking import MlflowClient

    args = [*CONSTANT, "trainer.max_steps=10", "trainer.val_check_interval=3", "checkpoint.every_n_steps=4",
            "phases=[{at:3,pos:none}]"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, str(ROOT / "tests" / "killer.py"), "6", *TINY, *args,
                             f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed, client = train_tiny(*args, "resume=true")
    reference, _ = train_tiny(*args)
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed_from_step"] == "4"
    for key in ("train/loss", "val/loss", "train/phase"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(resumed.run_id, key))
        want = sorted((m.step, m.value) for m in MlflowClient(store).get_metric_history(reference.run_id, key))
        assert [s for s, _ in got] == [s for s, _ in want]
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6, key
    assert abs(resumed.val_loss - reference.val_loss) <= 1e-6
