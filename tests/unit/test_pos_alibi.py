"""ALiBi (Press et al. 2022): head slopes from the paper's rule and the linear bias."""

import pytest
import torch

from positional.alibi import ALiBi, alibi_slopes
from positional.base import Shape


def test_slopes_for_eight_heads():
    # power of two: 2^(−8/8·h) = 1/2, 1/4, …, 1/256 (the paper's example)
    assert alibi_slopes(8).tolist() == [2.0**-h for h in range(1, 9)]


def test_slopes_for_twelve_heads():
    # closest power of two below is 8: its 8 slopes, then slopes 1, 3, 5, 7 of the 16-head set 2^(−h/2)
    want = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12).tolist() == pytest.approx(want, rel=1e-15)


def test_slopes_for_other_counts():
    assert alibi_slopes(1).tolist() == [2.0**-8]
    assert alibi_slopes(4).tolist() == pytest.approx([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    assert alibi_slopes(6).tolist() == pytest.approx([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])


@pytest.mark.parametrize("causal", [False, True])
def test_bias_is_minus_slope_times_distance(causal):
    scheme = ALiBi(Shape(48, 12, 2, 64, causal)).double()
    t = 20
    dense = scheme.logit_bias(torch.arange(t), layer=1).dense()[0]  # (H, T, T)
    i, j = torch.arange(t)[:, None].double(), torch.arange(t)[None, :].double()
    distance = (i - j) if causal else (i - j).abs()
    want = -alibi_slopes(12)[:, None, None] * distance  # (H, T, T)
    if causal:  # only the entries the causal mask keeps matter
        keep = (i >= j).expand_as(dense)
        dense, want = dense[keep], want[keep]
    torch.testing.assert_close(dense, want, rtol=0, atol=0)
