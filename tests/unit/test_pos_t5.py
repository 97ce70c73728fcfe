"""T5 relative position bias: the bucketing rule, both directions, and the bias it builds."""

import math

import pytest
import torch

from harness.errors import ConfigError
from positional.base import Shape
from positional.t5 import T5Bias, relative_position_bucket


def published_bucket(rel: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """The T5 rule written independently, one integer at a time (rel = key − query)."""
    n = num_buckets // 2 if bidirectional else num_buckets
    base = n if (bidirectional and rel > 0) else 0
    d = abs(rel) if bidirectional else max(-rel, 0)
    exact = n // 2
    if d < exact:
        return base + d
    return base + min(n - 1, exact + int(math.log(d / exact) / math.log(max_distance / exact) * (n - exact)))


DISTANCES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 63, 64, 100, 127, 128, 129, 500, 10_000]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (64, 256)])
def test_buckets_match_the_published_rule(bidirectional, num_buckets, max_distance):
    rel = torch.tensor(sorted({s * d for d in DISTANCES for s in (1, -1)}))
    got = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    want = [published_bucket(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()]
    assert got.tolist() == want


def test_known_values_of_the_default_rule():
    def b(rel, bidi):
        return relative_position_bucket(torch.tensor([rel]), bidi).item()

    # bidirectional: 16 buckets a direction, 8 exact; the future (key after query) is offset by 16
    distances = (0, 1, 7, 8, 11, 16, 32, 64, 127, 128, 1000)
    assert [b(-d, True) for d in distances] == [0, 1, 7, 8, 8, 10, 12, 14, 15, 15, 15]
    assert [b(d, True) for d in (1, 7, 8, 16, 128)] == [17, 23, 24, 26, 31]
    # causal: all 32 buckets for the past, 16 exact, log range 16 … 127, clamp at 31; future -> 0
    assert [b(-d, False) for d in (0, 15, 16, 32, 64, 127, 128, 10_000)] == [0, 15, 16, 21, 26, 31, 31, 31]
    assert [b(d, False) for d in (1, 50)] == [0, 0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_layer", [False, True])
def test_bias_is_the_bucket_table_entry(causal, per_layer):
    scheme = T5Bias(Shape(32, 2, 3, 64, causal), per_layer=per_layer).double()
    t = 40
    for layer in range(3):
        dense = scheme.logit_bias(torch.arange(t), layer).dense()[0]  # (H, T, T)
        table = scheme.bias[layer if per_layer else 0]
        for i, j in [(0, 0), (5, 2), (2, 5), (39, 0), (0, 39), (20, 3)]:
            bucket = published_bucket(j - i, bidirectional=not causal)
            torch.testing.assert_close(dense[:, i, j], table[:, bucket], rtol=0, atol=0)
    assert scheme.bias.shape == ((3 if per_layer else 1), 2, 32)


@pytest.mark.parametrize("kw", [dict(num_buckets=3), dict(num_buckets=31), dict(max_distance=8)])
def test_bad_options_are_refused_in_one_line(kw):
    with pytest.raises(ConfigError) as e:
        T5Bias(Shape(32, 2, 2, 64, False), **kw)
    assert "\n" not in str(e.value)
