"""Trainable-θ RoPE: starts as fixed RoPE, learns θ, reports its drift."""

import math

import pytest
import torch

from harness.errors import ConfigError
from positional.base import Shape
from positional.rope import Rope
from positional.rope_trainable import RopeTrainable

SHAPE = Shape(32, 2, 2, 64, causal=False)  # head dim 16


def test_starts_equal_to_fixed_rope():
    x = torch.randn(2, 2, 40, 16, dtype=torch.float64)
    positions = torch.arange(40)
    fixed = Rope(SHAPE).rotary(positions).rotate(x)
    learned = RopeTrainable(SHAPE).rotary(positions).rotate(x)
    torch.testing.assert_close(learned, fixed, rtol=0, atol=0)
    diag = RopeTrainable(SHAPE).diagnostics()
    assert diag["theta_rel_change"] == 0.0 and diag["theta_max_log_ratio"] == 0.0


def test_theta_receives_gradients_and_needs_no_weight_decay():
    rope = RopeTrainable(SHAPE, fraction=0.5)
    assert rope.inv_freq.requires_grad and rope.inv_freq.dim() == 1 and rope.inv_freq.shape == (4,)
    q, k = torch.randn(1, 2, 10, 16, dtype=torch.float64), torch.randn(1, 2, 10, 16, dtype=torch.float64)
    rot = rope.rotary(torch.arange(10))
    (rot.rotate(q) * rot.rotate(k)).sum().backward()
    assert rope.inv_freq.grad is not None and rope.inv_freq.grad.abs().min() > 0


def test_drift_diagnostics_and_artifact():
    rope = RopeTrainable(SHAPE)
    with torch.no_grad():
        rope.inv_freq[0] *= 2.0  # θ_0 = 1 -> 2
    theta0 = rope.theta0
    diag = rope.diagnostics()
    assert diag["theta_rel_change"] == pytest.approx(1.0 / theta0.norm().item(), rel=1e-12)
    assert diag["theta_max_log_ratio"] == pytest.approx(math.log(2.0), rel=1e-12)
    assert diag["theta_sign_flips"] == 0
    lines = rope.artifacts()["theta.csv"].splitlines()
    assert lines[0] == "i,theta0,theta_final,ratio" and len(lines) == 1 + 8
    assert [float(v) for v in lines[1].split(",")] == pytest.approx([0, 1.0, 2.0, 2.0])


def test_other_widths_are_refused():
    rot = RopeTrainable(SHAPE).rotary(torch.arange(4))
    with pytest.raises(ConfigError):
        rot.at_width(64)


def test_drift_is_logged_at_the_step_it_was_measured(train_tiny):
    """Lightning writes a row when (steps taken + 1) is a multiple of log_every_n_steps; a value logged at
    another step waited for the next row (9 steps late at the default 10): at the first row, after two
    updates, θ has moved; the stale value was step 0's, exactly 0."""
    summary, client = train_tiny("pos=rope_trainable", "trainer.log_every_n_steps=3")
    drift = client.get_metric_history(summary.run_id, "pos/theta_rel_change")
    loss = client.get_metric_history(summary.run_id, "train/loss")
    assert [m.step for m in drift] == [m.step for m in loss] == [3, 6]
    assert drift[0].value > 0 and drift[1].value > drift[0].value
