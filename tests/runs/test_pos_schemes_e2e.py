"""Every scheme: its config composes and instantiates, and it trains end to end into MLflow."""

import math
import re

import numpy as np
import pytest

from harness.config.catalog import option_classes
from harness.config.compat import compatibility
from harness.config.load import load
from harness.errors import IncompatiblePairing
from positional.base import PositionalScheme, Shape

SCHEMES = sorted(option_classes("pos"))  # every conf/pos option: a scheme added as one file + one YAML is here
NEW = ["xpos", "kerple", "fire", "p_rope", "cope", "pope"]  # 20 steps with every attention each one claims (a sample)
# schemes that read positions, so pos.randomize=true applies (the others declare why not)
RANDOMIZABLE = [n for n in SCHEMES if option_classes("pos")[n].randomize_refusal is None]


# schemes with a logit bias: the causal mask meets their bias (direction, a bias's far side), so CLM is run too
RELATIVE = [n for n in SCHEMES if "logit_bias" in option_classes("pos")[n].hooks()]


@pytest.mark.parametrize("name", SCHEMES)
def test_config_composes_and_names_its_module(name):
    causal = option_classes("pos")[name].bidirectional_refusal is not None  # defined for causal attention only
    scheme = load([f"pos={name}"]).pos.factory()(Shape(64, 4, 2, 32, causal=causal))
    assert isinstance(scheme, PositionalScheme) and scheme.config_name() == name
    assert bool(scheme.hooks()) == (name != "none")  # NoPE aside, a scheme overrides at least one hook
    assert (scheme.bias_kind != "none") == ("logit_bias" in scheme.hooks())


# 20 steps at a high learning rate: enough for a tiny model to learn most of the corpus's byte frequencies
LEARN = ["trainer.max_steps=20", "trainer.val_check_interval=10", "optim.optimizer.lr=1e-2", "model.dropout=0.0"]


@pytest.fixture(scope="module")
def halfway() -> float:
    """Halfway between guessing uniformly over the 258 ids and the unigram predictor of the corpus (the
    validation bytes scored by the training split's byte frequencies): a run below it learned something."""
    from harness.data.corpus import Embedded

    corpus = Embedded().load()
    counts = np.bincount(np.frombuffer(corpus.train, np.uint8), minlength=256) + 1.0
    unigram = -np.log((counts / counts.sum())[np.frombuffer(corpus.val, np.uint8)]).mean()
    assert 2.5 < unigram < 4.0  # English prose: about 4.7 bits a byte
    return (math.log(258) + unigram) / 2


def check_run(summary, client, name: str, bound: float):
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["pos"] == name
    val = client.get_metric_history(summary.run_id, "val/loss")
    assert val and all(math.isfinite(m.value) for m in val)
    assert summary.val_loss < bound, f"val loss {summary.val_loss:.3f} is not below {bound:.3f}: nothing learned"
    return run


@pytest.mark.parametrize("name", SCHEMES)
def test_scheme_trains_mlm_with_softmax(train_tiny, name, halfway):
    reason = option_classes("pos")[name].bidirectional_refusal
    if reason:  # defined for causal attention only (FoX): refused before training, with its reason
        with pytest.raises(IncompatiblePairing, match=re.escape(f"pos={name} with a bidirectional task: {reason}")):
            train_tiny(f"pos={name}", "attn=softmax", *LEARN)
        return
    summary, client = train_tiny(f"pos={name}", "attn=softmax", *LEARN)
    check_run(summary, client, name, halfway)


@pytest.mark.parametrize(
    "cell", [c for c in compatibility() if c.pos in NEW and c.allowed], ids=lambda c: f"{c.pos}-{c.attn}"
)
def test_new_scheme_trains_20_steps_with_every_attention_it_claims(train_tiny_shared, cell, halfway):
    summary, client = train_tiny_shared(f"pos={cell.pos}", f"attn={cell.attn}", *LEARN, "optim.schedule.warmup_steps=4")
    run = check_run(summary, client, cell.pos, halfway)
    assert run.data.tags["attn"] == cell.attn and summary.step == 20
    loss = [m.value for m in sorted(client.get_metric_history(summary.run_id, "train/loss"), key=lambda m: m.step)]
    assert len(loss) == 20 and sum(loss[-5:]) < sum(loss[:5])  # it learns


@pytest.mark.parametrize("name", RANDOMIZABLE)
def test_randomized_positions_train_and_evaluate_beyond_the_training_length(train_tiny_shared, name, halfway):
    summary, client = train_tiny_shared(
        f"pos={name}", "pos.randomize=true", "pos.max_position=64", "eval.lengths=[32,64]", *LEARN
    )
    run = check_run(summary, client, name, halfway)
    assert run.data.params["pos.randomize"] == "True" and run.data.params["pos.max_position"] == "64"
    assert math.isfinite(run.data.metrics["val/loss_at_64"])  # learned too: its table holds max_position
    assert not [t for t in run.data.tags if t.startswith("eval_skipped_at_")]


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_scheme_trains_clm(train_tiny, name, halfway):
    summary, client = train_tiny(f"pos={name}", "attn=softmax", "task=clm", *LEARN)
    assert check_run(summary, client, name, halfway).data.tags["task"] == "clm"


def test_rope_trainable_logs_theta_drift_and_artifact(train_tiny):
    summary, client = train_tiny("pos=rope_trainable")
    drift = client.get_metric_history(summary.run_id, "pos/theta_rel_change")
    assert len(drift) >= 2 and drift[0].value < drift[-1].value  # θ moves from θ0 during training
    assert client.get_metric_history(summary.run_id, "pos/theta_max_log_ratio")
    assert "theta.csv" in [a.path for a in client.list_artifacts(summary.run_id)]


def test_rope_length_scaling_applies_to_the_final_evaluation_only(train_tiny, halfway):
    """Training and validation use the plain angles (the same train/loss and val/loss, point for point, as
    plain RoPE at the same seed: validation scores the model as trained, not under the scaling);
    the final evaluation at eval.lengths uses the scaled ones (a different val/loss_at_64)."""
    lengths = "eval.lengths=[64]"
    scaled, client = train_tiny(
        "pos=rope", "pos/scaling=yarn", "pos.scaling.factor=2", "pos.fraction=0.5", lengths, *LEARN
    )
    plain, _ = train_tiny("pos=rope", "pos.fraction=0.5", lengths, *LEARN)
    run = check_run(scaled, client, "rope", halfway)
    assert run.data.params["pos.scaling.method"] == "yarn" and run.data.params["pos.scaling.original_max_len"] == "None"

    def history(summary, key):
        return [m.value for m in sorted(client.get_metric_history(summary.run_id, key), key=lambda m: m.step)]

    assert history(scaled, "train/loss") == history(plain, "train/loss")
    assert history(scaled, "val/loss") == history(plain, "val/loss")
    [at_64_scaled], [at_64_plain] = history(scaled, "val/loss_at_64"), history(plain, "val/loss_at_64")
    assert abs(at_64_scaled - at_64_plain) > 1e-6
