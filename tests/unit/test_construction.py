"""The run's model is constructed once, directly, right after the seed (harness/config/build.py): its initial
weights are bit for bit those the committed results were trained with, for every scheme × variant of both blocks,
a per-layer pattern with an entry's own settings, and randomized positions (tests/data/initial_weights.json, each
state_dict's sha256 as that construction made it). The checks' construction on meta draws nothing.

Performer's ``projection`` buffer is left out of the fingerprint: it is a pure function of its ``base_seed`` (which
is in it), drawn through LAPACK's QR, whose last bits differ between CPUs (MKL takes another path on another
processor); tests/unit/test_kernelized.py checks the draw against performer-pytorch's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lightning as L
import pytest
import torch

from harness.config.load import load
from harness.config.resources import model_of
from harness.data.tokenizer import ByteTokenizer

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "initial_weights.json").read_text())


def fingerprint(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        if k.endswith(".projection"):  # QR's rounding is the CPU's: see the module docstring
            continue
        t = v.detach().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def overrides_of(cell: str) -> tuple[list[str], int]:
    """The overrides and seed a fingerprint's name stands for (``classic-clm pos=rope attn=local``,
    ``pattern seed=1``)."""
    first, *rest = cell.split()
    if first in GOLDEN["blocks"]:
        return [*GOLDEN["blocks"][first], *rest], 0
    return list(GOLDEN["extra"][first]), int(rest[0].removeprefix("seed="))


@pytest.mark.parametrize("cell", sorted(GOLDEN["fingerprints"]))
def test_initial_weights_are_those_the_committed_results_were_trained_with(cell):
    overrides, seed = overrides_of(cell)
    spec = load([*GOLDEN["overrides"], *overrides])
    task = spec.task.build(tokenizer=ByteTokenizer())
    L.seed_everything(seed, verbose=False)
    model = model_of(spec, 258, task.sequence_tokens(spec.data.seq_len), task.causal)
    assert fingerprint(model) == GOLDEN["fingerprints"][cell]


def test_the_checks_construction_on_meta_draws_nothing():
    """``check`` builds the model on meta: the global generator is where the seed left it, so the real
    construction after it is the one above."""
    from harness.config.check import check
    from tests.helpers import spec

    torch.manual_seed(0)
    before = torch.get_rng_state()
    check(spec("attn=performer", "pos=t5"))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("cell", ["classic-clm pos=t5 attn=performer", "pattern seed=1"])
def test_the_benchmarks_build_the_runs_model(cell):
    """harness/bench/internals.py builds through the run's construction: the same seed, the same weights."""
    from harness.bench.internals import build_transformer, composed_model

    overrides, seed = overrides_of(cell)
    spec = load([*GOLDEN["overrides"], *overrides])
    task = spec.task.build(tokenizer=ByteTokenizer())
    seq_len = task.sequence_tokens(spec.data.seq_len)
    L.seed_everything(seed, verbose=False)
    run = fingerprint(model_of(spec, 258, seq_len, task.causal))
    L.seed_everything(seed, verbose=False)
    assert fingerprint(build_transformer([*GOLDEN["overrides"], *overrides], 258, seq_len, task.causal)) == run
    L.seed_everything(seed, verbose=False)
    assert fingerprint(composed_model(spec, 258, task.causal, "cpu")) == run
