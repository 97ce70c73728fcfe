"""Positional phases (``phases``): a run changes its scheme, its scaling or its training length at stated steps.
The state at a step by the rules, the model after a boundary against a model built that way, bad phases refused
in one line, the boundaries read back from MLflow, and a run killed past a boundary resumed exactly."""

from __future__ import annotations

import re
import types

import pytest
import torch

from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.phases import Phase, PhaseState, PositionPhases, describe, state_at
from harness.model.transformer import ModelConfig, Transformer
from positional.none import NoPosition
from positional.rope import Rope


def test_the_state_at_a_step_carries_what_a_phase_leaves_out():
    """A phase's keys last until another sets them; a new scheme drops the scaling."""
    rope = lambda shape: Rope(shape)  # noqa: E731
    phases = [
        Phase(10, "scaling=yarn", scaling="yarn", factor=2.0),
        Phase(20, "seq_len=16", seq_len=16),
        Phase(30, "pos=rope", pos=rope),
        Phase(40, "scaling=linear", scaling="linear", factor=4.0),
    ]
    assert state_at(phases, 9) == state_at([], 0) == PhaseState(-1, -1, None, None)
    assert state_at(phases, 10) == PhaseState(0, -1, ("yarn", 2.0), None)
    assert state_at(phases, 25) == PhaseState(1, -1, ("yarn", 2.0), 16)
    assert state_at(phases, 30) == PhaseState(2, 2, None, 16)  # the new scheme starts unscaled; the length stays
    assert state_at(phases, 10**9) == PhaseState(3, 2, ("linear", 4.0), 16)
    assert describe(phases[:2], "rope") == "0: pos=rope · 10: scaling=yarn · 20: seq_len=16"


def module_of(model):
    """What the callback reads of a LightningModule."""
    logged = {}
    return types.SimpleNamespace(
        model=model,
        device=torch.device("cpu"),
        global_step=0,
        scaled_in_training=False,
        log=lambda k, v: logged.__setitem__(k, v),
        logged=logged,
    )


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


def test_a_length_phase_cuts_packed_documents_with_their_tokens():
    """model.restart_positions and model.document_mask: a phase's seq_len cuts each window's document ids with its
    tokens, so the step trains on the first seq_len tokens of the window, documents and all."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_layers=2, d_model=32, n_heads=2, d_ff=64, dropout=0.0, restart_positions=True, document_mask=True
    )
    model = Transformer(cfg, 61, 16, True, Rope, Softmax).double().eval()
    ids, documents = torch.randint(61, (2, 16)), torch.tensor([[0] * 5 + [1] * 11, [0] * 3 + [1] * 9 + [2] * 4])
    batch = {"input_ids": ids, "labels": ids, "key_padding_mask": None, "document_ids": documents}
    callback = PositionPhases([Phase(3, "seq_len=8", seq_len=8)])
    callback.on_train_batch_start(types.SimpleNamespace(global_step=3), module_of(model), batch, 0)
    assert batch["document_ids"].shape == batch["input_ids"].shape == (2, 8)
    cut = model(batch["input_ids"], batch["key_padding_mask"], batch["document_ids"])
    torch.testing.assert_close(cut, model(ids[:, :8], None, documents[:, :8]), rtol=0, atol=0)


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


def test_the_validation_after_fit_scores_the_last_steps_phase():
    """max_steps off the validation interval: trainer.validate after fit (harness/train.py) scores the model with
    the scaling its last step trained in, as a validation inside fit would, and leaves it unscaled after."""
    model = tiny().train()
    module = module_of(model)
    callback = PositionPhases([Phase(4, "scaling=yarn factor=2", scaling="yarn", factor=2.0)])
    callback.on_train_batch_start(types.SimpleNamespace(global_step=4), module, {"input_ids": None}, 0)
    callback.on_train_end(None, module)
    validate = types.SimpleNamespace(global_step=5, state=types.SimpleNamespace(fn="validate"))
    callback.on_validation_start(validate, module)
    assert module.scaled_in_training and model.pos.scaling.method == "yarn" and model.pos.scaling.factor == 2.0
    callback.on_validation_end(validate, module)
    assert model.pos.scaling.method == "none" and not module.scaled_in_training
    fitting = types.SimpleNamespace(global_step=5, state=types.SimpleNamespace(fn="fit"))
    callback.on_validation_start(fitting, module)  # inside fit the training phase is in force already
    assert model.pos.scaling.method == "none"


@pytest.mark.parametrize(
    "phases, needle",
    [
        ("[{at:3,pso:none}]", "phases[0].pso is no phase key; use at, pos, scaling, factor, seq_len"),
        ("[{pos:none}]", "phases[0] has no 'at'"),
        ("[{at:3}]", "phases[0] changes nothing"),
        ("[{at:3,scaling:yarn}]", "phases[0]: scaling and factor go together"),
        ("[{at:3,scaling:yarn,factor:0.5}]", "phases[0].factor=0.5 must be a number > 1"),
        ("[{at:4,pos:none},{at:3,pos:rope}]", "phases[1].at=3 must lie after the previous phase's (4)"),
        ("[{at:6,pos:none}]", "phases[0].at=6 must lie after the previous phase's (0) and before trainer.max_steps=6"),
        ("[{at:3,pos:t5}]", "phases[0].pos=t5 has trained parameters"),
        ("[{at:3,pos:nope}]", "phases[0].pos names 'nope', which is no pos option; use names of conf/pos/"),
        ("[{at:3,pos:'rope(bse=2)'}]", "phases[0].pos.bse is not a key of pos=rope; use some of base, layout"),
        ("[{at:3,pos:none},{at:4,scaling:yarn,factor:2}]", "phases[1].scaling=yarn: the scheme in force then has no"),
        ("[{at:3,seq_len:64}]", "phases[0].seq_len=64 must lie in 2 … data.seq_len=32"),
        ("[{at:3,at2:1}]", "phases[0].at2 is no phase key"),
        ("[3]", "phases[0]=3 must be a mapping such as {at: 300, pos: none}"),
    ],
)
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
