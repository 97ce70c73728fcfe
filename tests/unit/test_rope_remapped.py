"""Self-Extend and DCA on posbench's own RoPE models (positional/rope_remapped.py, ``eval.scalings``): the same logits
as hf-eval's remapped attention on the model's export (whose attention tests/unit/test_remapped.py holds to the
papers' definitions pair by pair), beyond the trained length; refused with attention that never forms the logits."""

from __future__ import annotations

import pytest
import torch

from harness.errors import ConfigError
from tests.unit.test_export import T as TRAINED
from tests.unit.test_export import loaded, ours


@pytest.mark.parametrize("method", ["self_extend", "dca"])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_posbench_remapped_logits_equal_hf_evals_on_the_export(tmp_path, method, layout):
    from harness.pretrained.remapped import apply_remapped
    from positional.rope_remapped import DualChunk, SelfExtend

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


def test_self_extend_fits_the_farthest_distance_inside_the_trained_length():
    """W = 8 of a trained 16; G the smallest group whose farthest distance (query L − 1, key 0) is at most 15."""
    from positional.rope_remapped import SelfExtend

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
