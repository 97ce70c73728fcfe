"""Self-Extend and DCA on posbench's own RoPE models (positional/rope_remapped.py, ``eval.scalings``): each pair as
the papers define it (float64, 1e-12); the same logits as hf-eval's remapped attention on the model's export, beyond
the trained length; refused with attention that never forms the logits."""

from __future__ import annotations

import pytest
import torch

from harness.errors import ConfigError
from positional.rope_remapped import DualChunk, SelfExtend
from tests.unit.test_export import T as TRAINED
from tests.unit.test_export import loaded, ours


@pytest.mark.parametrize("method", ["self_extend", "dca"])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_posbench_remapped_logits_equal_hf_evals_on_the_export(tmp_path, method, layout):
    from harness.pretrained.remapped import apply_remapped

    model = ours(layout).double()
    hf = loaded(model, tmp_path).double()
    length = 3 * TRAINED
    ids = torch.randint(50, (2, length))
    remap = SelfExtend.fitting(length, TRAINED) if method == "self_extend" else DualChunk.fitting(TRAINED)
    apply_remapped(hf, remap)
    with torch.no_grad():
        plain = model(ids)
        with model.pos.rescaled(method, length):
            remapped = model(ids)
        theirs = hf(ids).logits
    # to fp32's precision: transformers computes RoPE's angles in float32 whatever the model's dtype
    torch.testing.assert_close(remapped, theirs, rtol=1e-6, atol=1e-6)
    assert (remapped - plain).abs().max() > 1e-3  # the remapping reached the attention
    assert model.pos.remap is None  # put back after the cell


@pytest.mark.parametrize("trained", [16, 64, 100, 200, 4096, 4100])
def test_dca_sizes_from_the_trained_length_are_the_authors(trained):
    """ChunkLlama's replace_with_chunkllama: chunk_size = ⌊3L/4⌋, local_window = ⌊L/16⌋, and the chunk s its
    attention cuts is chunk_size − local_window; so s + w = ⌊3L/4⌋ whatever L divides."""
    dca = DualChunk.fitting(trained)
    assert (dca.chunk, dca.local) == (trained * 3 // 4 - trained // 16, trained // 16)


def test_self_extend_fits_the_farthest_distance_inside_the_trained_length():
    """W = 8 of a trained 16; G the smallest group whose farthest distance (query L − 1, key 0) is at most 15."""

    def widest(remap: SelfExtend, length: int) -> int:
        i = torch.arange(length)
        _, (at_q, at_k, far) = remap.parts(i)
        return int((at_q[:, None] - at_k[None, :])[far & (i[:, None] >= i[None, :])].max())

    for length in (17, 32, 100, 1000):
        remap = SelfExtend.fitting(length, 16)
        assert remap.window == 8 and widest(remap, length) <= 15
        assert remap.group == 1 or widest(SelfExtend(remap.group - 1, 8), length) > 15


def test_attention_without_logits_refuses_it_before_training():
    from harness.config.check import check
    from harness.config.load import load

    spec = load(["task=clm", "attn=local", "eval.lengths=[256]", "eval.scalings=[self_extend]"])
    with pytest.raises(ConfigError, match="eval.scalings=self_extend remaps positions per query-key pair"):
        check(spec)
    check(load(["task=clm", "eval.lengths=[256]", "eval.scalings=[none,self_extend,dca]"]))
    pattern = ["task=clm", "eval.lengths=[256]", "eval.scalings=[dca]", "+pos.layers=[rope,none]", "attn=softmax"]
    check(load([*pattern, "+attn.layers=[softmax,local]"]))  # only the RoPE layers are remapped: softmax's
    with pytest.raises(ConfigError, match="eval.scalings=dca remaps positions per query-key pair, a content logit"):
        check(load([*pattern, "+attn.layers=[local,softmax]"]))


@pytest.mark.parametrize(
    "made", [SelfExtend(2, 4), SelfExtend(4, 8), DualChunk(5, 2), DualChunk(6, 1)], ids=lambda r: r.name()
)
def test_posbench_softmax_under_a_remap_is_the_papers_definition_pair_by_pair(made):
    """pos=rope (the half layout: transformers' doubled form) and attn=softmax, q, k, v random in float64: the output
    equals each pair computed from scratch at the paper's positions (tests/unit/test_remapped.py's reference)."""
    from attention.base import AttentionContext
    from attention.softmax import Softmax
    from positional.base import Shape
    from positional.rope import Rope
    from tests.unit.test_remapped import dca_at, reference, self_extend_at

    shape = Shape(64, 4, 1, 16, True)
    rope = Rope(shape, base=10000.0, layout="half").eval()
    rope.remap = made
    length, theta = 20, 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, length, 16, dtype=torch.float64) for _ in range(3))
    positions = rope.positions(length)
    ctx = AttentionContext(rope.rotary(positions), rope.logit_biases(positions, 1)[0], causal=True)
    got = Softmax(shape, backend="math")(q, k, v, ctx).transpose(1, 2)
    if isinstance(made, SelfExtend):
        at = lambda i, j: self_extend_at(i, j, made.group, made.window)  # noqa: E731
    else:
        at = lambda i, j: dca_at(i, j, made.chunk, made.local)  # noqa: E731
    torch.testing.assert_close(got, reference(q, k, v, at, theta, 16**-0.5), rtol=0, atol=1e-12)
