"""The rehearsal (harness/config/rehearsal.py): a training step measured on the meta device holds what the
real step holds, the key that makes a tensor large is the one named, and ranges declared in a signature
(harness/ranges.py) are checked from the config and from Python alike."""

from __future__ import annotations

import pytest
import torch

from harness.bench.internals import build_transformer, compose_cell, composed_model
from harness.bench.measure import peak_allocated_bytes
from harness.config.catalog import option_classes
from harness.config.compat import compatibility
from harness.config.rehearsal import OVERCOUNT, Largest, Phase, _forward, _step, culprit, integer_keys
from harness.errors import ConfigError

T, B, VOCAB = 64, 4, 258
SMALL = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=128",
    "model.dropout=0.0",
    f"data.seq_len={T}",
]
ALLOWED = [(c.pos, c.attn) for c in compatibility() if c.allowed]


def _overrides(pos: str, attn: str) -> list[str]:
    return [f"pos={pos}", f"attn={attn}", *SMALL, *(["attn.window=16"] if attn == "local" else [])]


@pytest.mark.parametrize("pos,attn", ALLOWED, ids=[f"{p}-{a}" for p, a in ALLOWED])
def test_a_rehearsed_step_holds_what_the_real_step_holds(pos, attn):
    """Forward and backward on meta against the same step on the CPU (torch.profiler's allocation peak):
    never below it by more than noise, never above it past OVERCOUNT, the slack check_phases allows."""
    torch.manual_seed(0)
    causal = option_classes("pos")[pos].bidirectional_refusal is not None  # FoX: defined causal only
    spec = compose_cell(_overrides(pos, attn))  # one config, built twice: on the CPU and on meta
    real = composed_model(spec, VOCAB, causal, "cpu").train()
    ids = torch.randint(256, (B, T))

    def step():
        real(ids).float().sum().backward()

    step()  # warm: lazily built caches (RoPE's cos/sin) are not the step's
    real.zero_grad(set_to_none=True)
    peak = peak_allocated_bytes(step, "cpu")
    meta = composed_model(spec, VOCAB, causal)
    measured = _step(meta, B, T).peak
    assert 0.95 * peak <= measured <= OVERCOUNT * peak, f"meta {measured:,} B vs real {peak:,} B"


def test_the_largest_tensor_is_found_with_the_module_that_made_it():
    with torch.device("meta"):
        model = build_transformer(["pos=fire", "pos.mlp_width=4096", *SMALL], VOCAB, T, causal=False)
    ledger = _step(model, B, T)
    assert ledger.largest.shape == (T * T, 4096) and ledger.largest.where.startswith("pos.mlps")
    assert ledger.peak >= ledger.largest.nbytes


def test_a_host_read_is_measured_up_to_the_read_and_then_whole():
    """Randomized positions size a relative table by the positions drawn (a host read): the draw over
    pos.max_position is counted, and so is the rest of the step."""
    overrides = ["pos=t5", "pos.randomize=true", "pos.max_position=10000000", *SMALL]
    with torch.device("meta"):
        model = build_transformer(overrides, VOCAB, T, causal=False)
    ledger = _step(model, B, T)
    assert ledger.largest.shape == (10_000_000,) and ledger.peak >= 8 * 10_000_000
    assert model.pos.randomize  # restored after the second pass
    plain = _step(build_meta(SMALL + ["pos=t5"]), B, T)
    assert plain.peak < ledger.peak


def build_meta(overrides):
    with torch.device("meta"):
        return build_transformer(overrides, VOCAB, T, causal=False)


def test_an_evaluation_forward_holds_no_activations_for_backward():
    model = build_meta(["pos=rope", *SMALL])
    assert _forward(model, B, T).peak < _step(model, B, T).peak


@pytest.mark.parametrize(
    "shape, keys, named",
    [
        (
            (8, 2, 32, 32, 100_000_000),
            {"data.batch_size": 8, "model.n_heads": 2, "pos.mlp_width": 100_000_000},
            "pos.mlp_width",
        ),
        ((8, 2, 32, 200_000_001), {"model.d_model": 32, "pos.npos": 100_000_000}, "pos.npos"),  # 2·npos + 1 rows
        ((100_000_000, 32, 258), {"data.batch_size": 100_000_000, "data.seq_len": 32}, "data.batch_size"),
        ((7, 3), {"model.d_model": 32}, None),
    ],
)
def test_the_key_named_is_the_one_that_sets_the_largest_dimension(shape, keys, named):
    phase = Phase("a training step", 1, Largest(1, shape, "pos.mlps.0"), "lower sizes", keys)
    assert culprit(phase) == named


def test_integer_keys_are_the_config_leaves():
    assert integer_keys({"pos": {"mlp_width": 7, "eps": 0.5, "on": True}, "seed": 1}) == {"pos.mlp_width": 7}


def test_a_performer_built_on_meta_draws_no_features(monkeypatch):
    from attention import performer
    from positional.base import Shape

    def drawn(*args):
        raise AssertionError("a meta construction drew the projection: O(M·D²) work for nothing")

    monkeypatch.setattr(performer, "draw_projection", drawn)
    with torch.device("meta"):
        variant = performer.Performer(Shape(64, 2, 1, 32, False), nb_features=10_000_000)
    assert variant.projection.is_meta


def test_ranges_in_a_signature_are_checked_from_python_too():
    from positional.base import Shape
    from positional.fire import Fire
    from positional.xpos import XPos

    shape = Shape(32, 2, 1, 16, False)
    with pytest.raises(ConfigError, match=r"^gamma=nan must be a positive number$"):
        XPos(shape, gamma=float("nan"))
    with pytest.raises(ConfigError, match=r"^mlp_width=0 must be a positive integer$"):
        Fire(shape, mlp_width=0)
    assert Fire(shape, mlp_width=3).mlps[0][0].out_features == 3


def test_ranges_in_a_signature_are_checked_by_the_schema_with_the_full_key():
    from harness.config.values import signature_schema
    from harness.ranges import check_value
    from positional.t5 import T5Bias

    fields, _ = signature_schema(T5Bias, ("shape",))
    check_value("pos.init_std", 0.0, fields["init_std"])
    with pytest.raises(ConfigError, match=r"^pos.init_std=-0.5 must be a number ≥ 0$"):
        check_value("pos.init_std", -0.5, fields["init_std"])
    with pytest.raises(ConfigError, match="must be a number"):
        check_value("pos.init_std", "abc", fields["init_std"])


def test_matrix_products_are_counted_and_a_phase_that_computes_for_hours_is_refused(monkeypatch):
    """A forward's FLOPs: at least the linear layers' 2·weights·tokens, and attention's T² term; a phase that
    computes more than STEP_HOURS even at FAST_CPU_RATE is refused with the figure and the fix — decided by FLOPs
    alone, so a busy machine and an idle one (whose measured rates differ widely) give the same answer."""
    import harness.config.rehearsal as rehearsal

    model = build_meta(["pos=rope", *SMALL])
    short, long = _forward(model, 1, T).flops, _forward(model, 1, 8 * T).flops
    linear = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2)
    assert short >= 2 * linear * T and long > 8 * short  # the T² of attention
    limit = rehearsal.FAST_CPU_RATE * rehearsal.STEP_HOURS * 3600
    phase = Phase("scoring eval.lengths entry 64", 1, None, "drop 64 from eval.lengths or shorten it", {}, 2 * limit)
    for rate in (1e9, 35e9):  # a loaded machine, an idle one: the same refusal
        monkeypatch.setattr(rehearsal, "cpu_flops_per_second", lambda rate=rate: rate)
        with pytest.raises(
            ConfigError,
            match=r"computes 7\.2e\+14 FLOP, more than 1 h even at 100 GFLOP/s \(≈ "
            r"[\d,.]+ h on this CPU now\); drop 64 from",
        ):
            rehearsal.check_phases([phase])
    monkeypatch.setattr(rehearsal, "cpu_flops_per_second", lambda: pytest.fail("an accepted phase reads no clock"))
    rehearsal.check_phases(
        [Phase("a training step", 1, None, "", {}, short), Phase("one length", 1, None, "", {}, 0.99 * limit)]
    )
