"""No host synchronisation in a training step: every allowed pos × attn pairing traces as ONE graph.

A forward that reads a tensor's value on the host (``.item()``, ``int(t)``, ``bool(t)``, ``torch.equal``, a
branch on data) waits, on a GPU, for every queued kernel. Under ``torch.compile(..., fullgraph=True)`` such a
read is one of: a graph break, an error with fullgraph; a branch on it, an error ("data-dependent");
a value captured into the graph (``item``), refused here by the backend; or a guard on the value (torch
2.13 specialises a module buffer's ``int(...)``), caught by a second call under ``error_on_recompile``.
The backend otherwise runs the graph as traced ("eager": dynamo only, no AOT autograd, no code generation),
so each cell costs a fraction of a second. tests/unit/test_compile.py checks compiled numbers (AOT autograd) on
a few cells.

Cells: every allowed pairing of ``harness.config.compat.compatibility()`` (a new scheme or variant is picked
up from its YAML) bidirectionally (task=mlm), full windows (no padding mask, as a corpus batch reaches the
model); and causally (task=clm) with padding, each scheme once with the variants taken in turn, so every
scheme and every variant runs causal and padded.

Not covered: randomized positions (pos.randomize=true, training only). The T sampled positions decide
shapes and branches there: the span S of a relative table (2S − 1 offsets, positional/base.py
``PositionalScheme.offsets``) and the length a scaled RoPE reads; and they are drawn on the CPU and copied to the
device. Sync-free, it would need tables over the static range ±(max_position − 1) and a pinned,
non-blocking copy (a change to positional/base.py and the relative schemes).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from harness.bench.internals import build_transformer, compose_cell, option_overrides
from harness.config.catalog import option_classes
from harness.config.compat import compatibility

T, VOCAB = 16, 258
TINY = [
    "model.n_layers=1",
    "model.d_model=16",
    "model.n_heads=2",
    "model.d_ff=32",
    "model.dropout=0.0",
    f"data.seq_len={T}",
]
ALLOWED = [(c.pos, c.attn) for c in compatibility() if c.allowed]


def _causal_cells() -> list[tuple[str, str]]:
    """Each scheme once, its allowed variants taken in turn: every scheme and every variant runs causally."""
    by_pos: dict[str, list[str]] = {}
    for pos, attn in ALLOWED:
        by_pos.setdefault(pos, []).append(attn)
    return [(pos, attns[i % len(attns)]) for i, (pos, attns) in enumerate(by_pos.items())]


# a scheme defined for causal attention only (bidirectional_refusal: FoX) refuses task=mlm: causal cells only
BIDIRECTIONAL = [(pos, attn) for pos, attn in ALLOWED if option_classes("pos")[pos].bidirectional_refusal is None]
CELLS = [(pos, attn, "mlm") for pos, attn in BIDIRECTIONAL] + [(pos, attn, "clm") for pos, attn in _causal_cells()]


def _overrides(pos: str, attn: str, task: str) -> list[str]:
    windowed = [f"attn.window={T // 2}"] if _windowed(attn) else []  # a window inside the short sequence
    return [f"pos={pos}", f"attn={attn}", f"task={task}", *TINY, *windowed]


@functools.cache
def _windowed(attn: str) -> bool:
    return "window" in compose_cell([f"attn={attn}"]).attn.option.kwargs


@functools.cache
def _is_causal(task: str) -> bool:
    spec = compose_cell([f"task={task}"])
    return spec.task.build(tokenizer=spec.tokenizer.build()).causal


def _reading_no_value(reads: list[str]):
    """A dynamo backend that runs the graph as traced and records every value it reads back to the host."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        reads.extend(
            f"{n.target} ({n.stack_trace.strip().splitlines()[-2].strip() if n.stack_trace else '?'})"
            for n in gm.graph.nodes
            if n.target in HOST_READS
        )
        return gm.forward

    return backend


HOST_READS = ("item", "tolist", torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default)


@pytest.mark.parametrize("pos,attn,task", CELLS, ids=[f"{p}-{a}-{t}" for p, a, t in CELLS])
def test_training_step_traces_as_one_graph(pos, attn, task):
    _traces_as_one_graph(_overrides(pos, attn, task), _is_causal(task))


# Per-layer patterns (harness/model/layers.py): each layer's rotation and bias are picked by the pattern, from
# shapes; a rotation on some layers only (RNoPE-SWA's, two layers for speed), a bias table, two variants in one model
PATTERNS = [("rope+none", "local+softmax", "clm"), ("t5+none", "softmax", "mlm"), ("alibi+rope", "linear", "clm")]


@pytest.mark.parametrize("pos,attn,task", PATTERNS, ids=[f"{p}-{a}-{t}" for p, a, t in PATTERNS])
def test_a_per_layer_pattern_traces_as_one_graph(pos, attn, task):
    tiny = [o for o in TINY if not o.startswith("model.n_layers")]
    window = [f"attn.window={T // 2}"] if attn.startswith("local") else []
    _traces_as_one_graph(
        [
            *option_overrides("pos", pos),
            *option_overrides("attn", attn),
            f"task={task}",
            *tiny,
            "model.n_layers=2",
            *window,
        ],
        _is_causal(task),
    )


def _traces_as_one_graph(overrides: list[str], causal: bool) -> None:
    torch.manual_seed(0)
    model = build_transformer(overrides, VOCAB, T, causal).train()
    ids, labels = torch.randint(256, (2, T)), torch.randint(256, (2, T))
    mask = (torch.arange(T) < torch.tensor([[T], [T - 5]])) if causal else None  # (B, T): row 1 padded

    def step(ids, labels, mask):  # forward and loss in the graph; backward runs the graph's autograd
        return F.cross_entropy(model(ids, mask).flatten(0, 1), labels.flatten())

    eager = step(ids, labels, mask)
    eager.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    reads: list[str] = []
    compiled = torch.compile(step, fullgraph=True, backend=_reading_no_value(reads))
    with torch._dynamo.config.patch(error_on_recompile=True):
        loss = compiled(ids, labels, mask)
        model.before_training_step(1)  # the loop's per-step call between forwards (Performer's redraw)
        compiled(torch.randint(256, (2, T)), labels, mask)  # other tokens, a step later: no guard fails
    assert not reads, f"values read back to the host inside the graph: {reads}"
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)  # the traced step is the eager step
    assert {n for n, p in model.named_parameters() if p.grad is not None} == grads
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_every_allowed_pairing_and_every_scheme_causally_is_a_cell():
    """The cells come from the compatibility matrix: a new YAML in conf/pos or conf/attn adds its cells."""
    assert {(p, a) for p, a, t in CELLS if t == "mlm"} == set(BIDIRECTIONAL)
    assert {p for p, a, t in CELLS if t == "clm"} == {p for p, a in ALLOWED}
    assert {a for p, a, t in CELLS if t == "clm"} == {a for p, a in ALLOWED}


@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_decides_its_softmax_from_shapes_as_the_mask_would(causal):
    """attention/local.py reads no tensor to pick torch's fused softmax: without padding, a row sees no key
    exactly when it is a padded tail row beyond T + left, i.e. when tail > left (the mask's own answer)."""
    from attention.local import band_limits

    for t in range(1, 40):
        for window in range(1, t + 1):
            left, right = band_limits(window, causal)
            block = min(max(window, 16), t)
            n = -(-t // block)
            tail = n * block - t
            i = torch.arange(n * block)[:, None]  # every (padded) query row
            j = torch.arange(t)[None, :]
            sees = ((i - j <= left) & (j - i <= right)).any(-1)
            assert bool(sees.all()) == (tail <= left), (t, window)
