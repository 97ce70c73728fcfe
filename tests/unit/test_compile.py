"""model.compile=true: the model traced by torch.compile (dynamo + AOT autograd, the stages where the
harness's own code can break tracing; the "aot_eager" backend skips inductor's C++ code generation,
which tests/unit/test_scaleout.py's opt-in POSBENCH_TEST_COMPILE run covers) gives the eager logits and
gradients, for the schemes and variants whose code paths differ: complex-view RoPE, learned logit
biases, content biases, and each attention variant with and without a rotation."""

import pytest
import torch

from harness.bench.internals import build_transformer

CELLS = [
    ("rope", "softmax"),
    ("t5", "softmax"),
    ("xl", "softmax"),
    ("alibi", "local"),
    ("rope", "performer"),
    ("none", "linear"),
    ("t5", "linear"),
]


@pytest.mark.parametrize("pos,attn", CELLS)
def test_compiled_model_matches_eager(pos, attn):
    torch.manual_seed(0)
    # two of model=small's four layers: the second reads the first's output as every later one would, and
    # tracing (dynamo inlines each layer) costs in proportion to the layers
    small = ["model=small", "model.n_layers=2", "model.dropout=0.0", "data.seq_len=32"]
    model = build_transformer([f"pos={pos}", f"attn={attn}", *small], 258, 32, False)
    ids = torch.randint(256, (2, 32))

    def logits_and_grads(forward):
        model.zero_grad(set_to_none=True)
        logits = forward(ids)
        logits.square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager = logits_and_grads(model)
    torch._dynamo.reset()
    compiled = logits_and_grads(torch.compile(model, backend="aot_eager"))
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-4, atol=1e-5)
    assert compiled[1].keys() == eager[1].keys()
    for name, grad in eager[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=1e-3, atol=1e-6, msg=name)
