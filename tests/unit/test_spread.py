"""results/spread.py: an arm's spread split into seeds and validation sample, checked on tables drawn from the
two-way model with known variance components (fp64), and on its algebra."""

import math

import numpy as np
import pytest

from results.spread import paired_error, split, table


def draw(rng, seeds: int, windows: int, sd_seed: float, sd_window: float, sd_noise: float, common=None):
    """x[s, w] = 2 + a_s + b_w + e_sw; ``common``: the window effects b to use (another arm's, paired)."""
    b = rng.normal(0, sd_window, windows) if common is None else common
    return 2 + rng.normal(0, sd_seed, (seeds, 1)) + b[None, :] + rng.normal(0, sd_noise, (seeds, windows)), b


@pytest.mark.parametrize(
    ("sd_seed", "sd_noise"),
    [(0.05, 0.5), (0.01, 0.5), (0.02, 2.0)],  # seeds dominate; the validation sample dominates; about equal
)
def test_the_components_are_recovered_on_average_from_tables_of_known_components(sd_seed, sd_noise):
    rng = np.random.default_rng(0)
    seeds, windows, reps = 6, 400, 2000
    parts = [split(draw(rng, seeds, windows, sd_seed, 0.7, sd_noise)[0]) for _ in range(reps)]
    sample = np.array([p.sample**2 for p in parts])
    seed = np.array([p.spread**2 - p.sample**2 for p in parts])  # before the floor at 0: the unbiased moment
    for got, want in ((sample, sd_noise**2 / windows), (seed, sd_seed**2)):
        assert abs(got.mean() - want) < 4 * got.std(ddof=1) / math.sqrt(reps)  # within its Monte-Carlo error
    assert sample.std() / sample.mean() < 0.05  # the interaction mean square is tight (≈ √(2 / (5 · 399)))


def test_the_two_parts_add_up_to_the_spread_in_squares_unless_the_seeds_part_is_floored():
    rng = np.random.default_rng(1)
    for _ in range(200):
        s = split(draw(rng, 4, 50, 0.02, 0.3, 0.2)[0])
        if s.seeds > 0:
            assert s.seeds**2 + s.sample**2 == pytest.approx(s.spread**2, rel=1e-12)
        else:
            assert s.sample >= s.spread
    assert split(draw(rng, 5, 300, 0.05, 0.3, 0.2)[0]).shrinks == "more seeds"
    assert split(draw(rng, 5, 300, 0.0, 0.3, 3.0)[0]).shrinks == "more validation windows (data.eval_batches)"


def test_a_table_row_averages_to_its_runs_token_weighted_val_loss():
    rng = np.random.default_rng(2)
    tokens = rng.integers(10, 40, 30).astype(float)  # masked-LM windows score different token counts
    records = [{"loss_sum": list(rng.uniform(1, 3, 30) * tokens), "tokens": list(tokens)} for _ in range(3)]
    x = table(records)
    assert x is not None and x.shape == (3, 30)
    for row, r in zip(x, records, strict=True):
        assert row.mean() == pytest.approx(sum(r["loss_sum"]) / sum(r["tokens"]), rel=1e-14)
    other = {"loss_sum": records[0]["loss_sum"], "tokens": [*tokens[:-1], tokens[-1] + 1]}
    assert table([*records, other]) is None  # not the same windows: no table
    assert table(records[:1]) is None  # one run has no spread


def test_paired_windows_cancel_in_a_difference_of_arms():
    rng = np.random.default_rng(3)
    x, b = draw(rng, 5, 500, 0.02, 1.0, 0.1)
    y, _ = draw(rng, 5, 500, 0.02, 1.0, 0.1, common=b)  # the same windows, equally hard for both arms
    paired = paired_error(x, y)
    assert paired is not None
    # what is left is the per-window noise of both arms' seed means: √(2 · 0.1² / 5 / 500)
    assert paired == pytest.approx(math.sqrt(2 * 0.01 / 5 / 500), rel=0.1)
    unpaired = np.sqrt(x.mean(0).var(ddof=1) / 500)  # one arm's own window error: the window effects' ≈ 1/√500
    assert paired < unpaired / 10
    assert paired_error(x, y[:, :400]) is None
