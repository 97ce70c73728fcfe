"""Randomized positions (Ruoss et al. 2023): the draw, one sample per forward for every hook, evaluation
at a sample of its own (the paper's) or at 0 … T−1 (pos.eval_positions=ordered), the schemes that take it
(relative biases turn positional), the refusals, and exact resume."""

from functools import partial

import pytest
import torch
from torch.testing import assert_close

from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.config.catalog import option_classes
from harness.errors import ConfigError, IncompatiblePairing
from harness.model.transformer import ModelConfig, Transformer
from positional.alibi import ALiBi, alibi_slopes
from positional.base import PositionalBias, PositionalScheme, RelativeBias, Shape, randomized_positions
from positional.kerple import Kerple
from positional.learned import Learned
from positional.randomized import randomized
from positional.rope import Rope
from positional.t5 import T5Bias, relative_position_bucket
from tests.attn_cases import F64

SHAPE = Shape(16, 2, 2, 12, causal=True)


def test_draws_are_sorted_distinct_in_range_and_seeded():
    torch.manual_seed(5)
    draws = [randomized_positions(12, 40) for _ in range(50)]
    for p in draws:
        assert p.shape == (12,) and p.dtype == torch.long
        assert (p.diff() > 0).all() and p.min() >= 0 and p.max() < 40  # sorted and distinct, in [0, 40)
    assert len({tuple(p.tolist()) for p in draws}) == 50  # a fresh sample per call
    torch.manual_seed(5)
    assert all(torch.equal(randomized_positions(12, 40), p) for p in draws)  # the global RNG decides


def test_every_position_is_equally_likely():
    torch.manual_seed(0)
    counts = torch.zeros(32)
    for _ in range(4000):
        counts[randomized_positions(8, 32)] += 1
    assert ((counts / 4000 - 8 / 32).abs() < 0.03).all()  # inclusion probability T/N for each position


class Probe(PositionalScheme):
    """Records the positions every hook receives."""

    def __init__(self, shape):
        super().__init__(shape)
        self.seen = []

    def embed(self, x, positions):
        self.seen.append(("embed", positions))
        return x

    def rotary(self, positions):
        self.seen.append(("rotary", positions))

    def logit_bias(self, positions, layer):
        self.seen.append((f"bias{layer}", positions))


def _probe_model(**sampling) -> Transformer:
    return Transformer(
        ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=16),
        10,
        12,
        True,
        pos=randomized(Probe, randomize=True, max_position=100, **sampling),
        attn=partial(Softmax),
    )


def test_the_model_draws_once_per_training_forward():
    torch.manual_seed(0)
    model = _probe_model()
    model.train()(torch.zeros(3, 12, dtype=torch.long))
    names, positions = zip(*model.pos.seen, strict=True)
    assert names == ("embed", "rotary", "bias0", "bias1")
    assert all(p is positions[0] for p in positions)  # one sample, shared by every hook and layer
    assert positions[0].max() < 100 and not torch.equal(positions[0], torch.arange(12))


def _eval_draws(model: Transformer, forwards: int) -> list[torch.Tensor]:
    """The positions of ``forwards`` evaluation forwards in one pass (one switch to evaluation)."""
    model.pos.seen.clear()
    model.eval()
    for _ in range(forwards):
        model(torch.zeros(3, 12, dtype=torch.long))
    return [p for name, p in model.pos.seen if name == "embed"]


def test_evaluation_draws_its_own_sample_by_default_without_moving_the_training_draws():
    """Ruoss et al.'s reference code samples positions at evaluation too: the default. Its draws come from a
    generator of its own, reseeded at every switch to evaluation, so a validation leaves the training draws
    (and a resume) as they were and scores the same positions whenever it runs."""
    torch.manual_seed(0)
    model = _probe_model()
    assert model.pos.eval_positions == "sampled"
    state = torch.get_rng_state()
    first = _eval_draws(model, 3)
    assert torch.equal(torch.get_rng_state(), state)
    for p in first:
        assert (p.diff() > 0).all() and 0 <= p.min() and p.max() < 100 and not torch.equal(p, torch.arange(12))
    assert not torch.equal(first[0], first[1])  # a fresh sample per forward
    model.train()(torch.zeros(3, 12, dtype=torch.long))  # training in between: the next pass is the same
    assert all(torch.equal(a, b) for a, b in zip(first, _eval_draws(model, 3), strict=True))


def test_ordered_evaluation_uses_0_to_t_and_draws_nothing():
    model = _probe_model(eval_positions="ordered")
    state = torch.get_rng_state()
    assert all(torch.equal(p, torch.arange(12)) for p in _eval_draws(model, 2))
    assert torch.equal(torch.get_rng_state(), state)


def test_sampled_evaluation_longer_than_the_range_is_refused_with_the_way_out():
    probe = randomized(Probe, randomize=True, max_position=20)(SHAPE).eval()
    with pytest.raises(ConfigError, match="max_position=20 < sequence length 21.+pos.eval_positions=ordered"):
        probe.positions(21)
    ordered = randomized(Probe, randomize=True, max_position=20, eval_positions="ordered")(SHAPE)
    assert torch.equal(ordered.eval().positions(21), torch.arange(21))


def test_rope_evaluated_at_sampled_positions_rotates_by_them():
    """RoPE keeps one 0 … T−1 tensor (and its cos, sin) per length; a sampled evaluation must bypass it."""
    rope = randomized(Rope, randomize=True, max_position=64)(Shape(16, 2, 2, 12, causal=True)).double().eval()
    p = rope.positions(12)
    assert not torch.equal(p, torch.arange(12))
    q = torch.randn(1, 2, 12, 8, dtype=F64)
    reference = Rope(Shape(16, 2, 2, 64, causal=True)).double().eval()
    at_p = torch.zeros(1, 2, 64, 8, dtype=F64)
    at_p[:, :, p] = q  # q's rows placed at positions p of a 0 … 63 input
    assert_close(rope.rotary(p).rotate(q), reference.rotary(torch.arange(64)).rotate(at_p)[:, :, p], rtol=0, atol=1e-13)


def test_learned_table_holds_max_position_and_serves_longer_evaluation():
    learned = randomized(Learned, randomize=True, max_position=64)(SHAPE)
    assert learned.table.num_embeddings == 64 and Learned(SHAPE).table.num_embeddings == 12
    learned.eval()
    x = torch.zeros(1, 64, 16)
    assert learned.embed(x, learned.positions(64)).shape == (1, 64, 16)
    with pytest.raises(ConfigError, match="pos=learned has 64 positions"):
        learned.embed(torch.zeros(1, 65, 16), torch.arange(65))


@pytest.mark.parametrize("causal", [False, True])
def test_relative_biases_read_the_sampled_offsets(causal):
    torch.manual_seed(1)
    shape = Shape(16, 2, 2, 12, causal)
    p = torch.tensor([0, 3, 4, 9, 30, 31, 60])
    offsets = (p[:, None] - p[None, :]).to(F64)  # (T, T) p_i − p_j
    distance = offsets if causal else offsets.abs()
    alibi = randomized(ALiBi, randomize=True, max_position=64)(shape).logit_bias(p, 0)
    assert isinstance(alibi, PositionalBias)
    assert_close(alibi.dense()[0], -alibi_slopes(2)[:, None, None] * distance, rtol=0, atol=0)
    t5 = randomized(T5Bias, randomize=True, max_position=64)(shape).double()
    buckets = relative_position_bucket(-(p[:, None] - p[None, :]), not causal)  # (T, T)
    assert_close(t5.logit_bias(p, 0).dense()[0], t5.bias[0][:, buckets], rtol=0, atol=0)
    kerple = randomized(Kerple, randomize=True, max_position=64)(shape).double()
    r1, r2 = kerple.r1[0][:, None, None], kerple.r2[0][:, None, None]
    assert_close(kerple.logit_bias(p, 0).dense()[0], -r1 * torch.log1p(r2 * offsets.abs()), rtol=1e-14, atol=0)
    consecutive = randomized(ALiBi, randomize=True, max_position=64)(shape).logit_bias(torch.arange(7), 0)
    assert isinstance(consecutive, RelativeBias)  # evaluation positions: the Toeplitz form again


def test_a_randomized_relative_bias_is_refused_where_only_toeplitz_biases_are_applied():
    t5 = randomized(T5Bias, randomize=True, max_position=64)(SHAPE)
    assert T5Bias.bias_kind == "relative" and t5.bias_kind == "positional"  # the instance, not the class
    for variant in (Local, Performer):
        assert variant.refusal(T5Bias) is None
        assert "pos.randomize=true" in variant.refusal(t5)
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=16)
    with pytest.raises(IncompatiblePairing, match="attn=local cannot apply a positional logit bias .pos=t5."):
        Transformer(
            cfg, 10, 12, True, pos=randomized(T5Bias, randomize=True, max_position=64), attn=partial(Local, window=4)
        )
    Transformer(cfg, 10, 12, True, pos=randomized(T5Bias, randomize=True, max_position=64), attn=partial(Softmax))


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(randomize=True), "needs max_position ≥ the training length 12"),
        (dict(randomize=True, max_position=8), "needs max_position ≥ the training length 12"),
        (dict(max_position=64), "^max_position=64 only applies with randomize=true"),
        (dict(randomize="yes", max_position=64), "^randomize='yes': use true or false"),
        (dict(eval_positions="ordered"), "^eval_positions=ordered only applies with randomize=true"),
        (dict(randomize=True, max_position=64, eval_positions="random"), "^eval_positions='random': use sampled or"),
    ],
)
def test_bad_sampling_options_are_refused_in_one_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        randomized(ALiBi, **kw)(SHAPE)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(n for n, c in option_classes("pos").items() if c.randomize_refusal))
def test_schemes_without_positions_refuse_randomize(name):
    """Built by the harness, the scheme's own error (worded by argument) names the config keys."""
    from harness.config.load import load

    pos = load([f"pos={name}", "pos.randomize=true", "pos.max_position=64"]).pos.factory()
    with pytest.raises(ConfigError, match=f"^pos.randomize=true with pos={name}: .+; use pos.randomize=false"):
        pos(SHAPE)


def test_randomized_positions_are_a_wrapper_no_scheme_repeats():
    """No scheme's signature or YAML names pos.randomize & co: the wrapper (positional/randomized.py) takes them
    for any scheme, Probe above included, and conf/config.yaml gives every pos node them once."""
    import inspect

    from omegaconf import OmegaConf

    from harness.paths import CONF
    from positional.randomized import KEYS

    for name, cls in option_classes("pos").items():
        assert not set(KEYS) & set(inspect.signature(cls.__init__).parameters), name
        assert not set(KEYS) & set(OmegaConf.load(CONF / "pos" / f"{name}.yaml")), name
    assert {k: v for k, v in OmegaConf.load(CONF / "config.yaml").pos.items()} == dict.fromkeys(KEYS, None) | {
        "randomize": False
    }


def test_the_catalogue_says_any_pos_takes_randomized_positions_and_which_refuse():
    from harness.config.catalog import render_catalogue

    text = " ".join(render_catalogue().split())
    refusing = sorted(n for n, c in option_classes("pos").items() if c.randomize_refusal)
    assert "any pos takes pos.randomize=true pos.max_position=N" in text
    assert f"except {', '.join(refusing)}, which refuse it" in text
