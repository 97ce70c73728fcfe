"""loss_chunk: the tests that train end to end (the rest: tests/unit/test_loss_chunk.py).

model.loss_chunk: the training loss from a chunk of tokens' logits at a time (harness/model/loss.py) is the
plain cross-entropy, value and gradients, and the memory estimate counts one chunk's logits.
"""

import pytest


@pytest.mark.parametrize("shape,precision", [(2, "bf16-mixed")])
def test_the_estimate_is_within_ten_percent_of_the_tensors_peak_on_this_cpu(shape, precision):
    """The formula against a real step (harness/bench/cpu_memory.py, in a fresh process): the 32k-vocabulary shape
    under bf16 autocast with its logits 256 tokens at a time (the chunked loss and the estimate's chunk term
    together). All ten rows: results/bench_cpu_memory/, a benchmark's figures (test below)."""
    from harness.bench.cpu_memory import TENSORS, TOLERANCE, _child

    row = _child(shape, precision, TENSORS)
    assert abs(row.ratio - 1) <= TOLERANCE, f"measured {row.measured_mib:.0f} MiB vs estimate {row.estimate_mib:.0f}"
