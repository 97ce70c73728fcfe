"""Randomized positions (Ruoss et al. 2023): the draw, one sample per forward for every hook, evaluation
at 0 … T−1, the schemes that take it (relative biases turn positional), the refusals, and exact resume."""

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

    def __init__(self, shape, **sampling):
        super().__init__(shape, **sampling)
        self.seen = []

    def embed(self, x, positions):
        self.seen.append(("embed", positions))
        return x

    def rotary(self, positions):
        self.seen.append(("rotary", positions))

    def logit_bias(self, positions, layer):
        self.seen.append((f"bias{layer}", positions))


def test_the_model_draws_once_per_training_forward_and_uses_0_to_t_in_evaluation():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=16), 10, 12, True,
                        pos=partial(Probe, randomize=True, max_position=100), attn=partial(Softmax))
    ids = torch.zeros(3, 12, dtype=torch.long)
    model.train()(ids)
    names, positions = zip(*model.pos.seen, strict=True)
    assert names == ("embed", "rotary", "bias0", "bias1")
    assert all(p is positions[0] for p in positions)  # one sample, shared by every hook and layer
    assert positions[0].max() < 100 and not torch.equal(positions[0], torch.arange(12))
    model.pos.seen.clear()
    state = torch.get_rng_state()
    model.eval()(ids)
    assert all(torch.equal(p, torch.arange(12)) for _, p in model.pos.seen)
    assert torch.equal(torch.get_rng_state(), state)  # evaluation draws nothing: it cannot shift a resume


def test_learned_table_holds_max_position_and_serves_longer_evaluation():
    learned = Learned(SHAPE, randomize=True, max_position=64)
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
    alibi = ALiBi(shape, randomize=True, max_position=64).logit_bias(p, 0)
    assert isinstance(alibi, PositionalBias)
    assert_close(alibi.dense()[0], -alibi_slopes(2)[:, None, None] * distance, rtol=0, atol=0)
    t5 = T5Bias(shape, randomize=True, max_position=64).double()
    buckets = relative_position_bucket(-(p[:, None] - p[None, :]), not causal)  # (T, T)
    assert_close(t5.logit_bias(p, 0).dense()[0], t5.bias[0][:, buckets], rtol=0, atol=0)
    kerple = Kerple(shape, randomize=True, max_position=64).double()
    r1, r2 = kerple.r1[0][:, None, None], kerple.r2[0][:, None, None]
    assert_close(kerple.logit_bias(p, 0).dense()[0], -r1 * torch.log1p(r2 * offsets.abs()), rtol=1e-14, atol=0)
    consecutive = ALiBi(shape, randomize=True, max_position=64).logit_bias(torch.arange(7), 0)
    assert isinstance(consecutive, RelativeBias)  # evaluation positions: the Toeplitz form again


def test_a_randomized_relative_bias_is_refused_where_only_toeplitz_biases_are_applied():
    t5 = T5Bias(SHAPE, randomize=True, max_position=64)
    assert T5Bias.bias_kind == "relative" and t5.bias_kind == "positional"  # the instance, not the class
    for variant in (Local, Performer):
        assert variant.refusal(T5Bias) is None
        assert "pos.randomize=true" in variant.refusal(t5)
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=16)
    with pytest.raises(IncompatiblePairing, match="attn=local cannot apply a positional logit bias .pos=t5."):
        Transformer(cfg, 10, 12, True, pos=partial(T5Bias, randomize=True, max_position=64),
                    attn=partial(Local, window=4))
    Transformer(cfg, 10, 12, True, pos=partial(T5Bias, randomize=True, max_position=64), attn=partial(Softmax))


@pytest.mark.parametrize("kw,match", [
    (dict(randomize=True), "needs max_position ≥ the training length 12"),
    (dict(randomize=True, max_position=8), "needs max_position ≥ the training length 12"),
    (dict(max_position=64), "^max_position=64 only applies with randomize=true"),
    (dict(randomize="yes", max_position=64), "^randomize='yes': use true or false"),
])
def test_bad_sampling_options_are_refused_in_one_line(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        ALiBi(SHAPE, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(n for n, c in option_classes("pos").items() if c.randomize_refusal))
def test_schemes_without_positions_refuse_randomize(name):
    """Built by the harness, the scheme's own error (worded by argument) names the config keys."""
    from harness.config.instantiate import instantiate_option
    from tests.helpers import compose

    pos = instantiate_option(compose([f"pos={name}", "pos.randomize=true", "pos.max_position=64"]).pos, "pos")
    with pytest.raises(ConfigError, match=f"^pos.randomize=true with pos={name}: .+; use pos.randomize=false"):
        pos(SHAPE)


@pytest.mark.slow
def test_resume_of_a_randomized_run_is_exact(store, tmp_path, train_tiny):
    from mlflow.tracking import MlflowClient

    from tests.helpers import TINY
    from tests.test_resume import LONG, history, kill_at

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # as the killed subprocess trains (see test_resume)
    try:
        randomized = ("pos=t5", "pos.randomize=true", "pos.max_position=96")
        kill_at(6, store, tmp_path, *TINY, *LONG, *randomized)
        resumed, _ = train_tiny(*LONG, *randomized, "resume=true")
        reference, _ = train_tiny(*LONG, *randomized)  # uninterrupted: a new run
    finally:
        torch.set_default_dtype(previous)
    client = MlflowClient(store)
    got, want = history(client, resumed.run_id, "train/loss"), history(client, reference.run_id, "train/loss")
    assert [s for s, _ in got] == [s for s, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) <= 1e-6
    assert abs(resumed.val_loss - reference.val_loss) <= 1e-6  # steps 5 … 10 drew the same positions
