"""The model's seams: shapes, masks, configs validated before anything is built."""

import pytest
import torch

from attention.softmax import Softmax
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from positional.none import NoPosition
from positional.rope import Rope


def build(causal=False, pos=Rope, **kw):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, **kw)
    return Transformer(cfg, vocab_size=258, max_len=16, causal=causal, pos=pos, attn=Softmax).eval()


def test_logits_shape_and_tied_decoder():
    model = build()
    logits = model(torch.randint(256, (3, 16)))
    assert logits.shape == (3, 16, 258)
    assert model.tok_emb.weight.data_ptr() in {p.data_ptr() for p in model.parameters()}
    assert not any(p.shape == (258, 32) and p is not model.tok_emb.weight for p in model.parameters())


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_causal_model_ignores_the_future(norm):
    torch.manual_seed(0)
    model = build(causal=True, norm=norm)
    x = torch.randint(256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    torch.testing.assert_close(model(x)[0, :10], model(y)[0, :10])
    assert not torch.allclose(model(x)[0, 10:], model(y)[0, 10:])


def test_padded_keys_do_not_change_real_positions():
    torch.manual_seed(0)
    model = build()
    x = torch.randint(256, (1, 16))
    keep = torch.arange(16)[None] < 11
    y = x.clone()
    y[0, 11:] = 7
    torch.testing.assert_close(model(x, keep)[0, :11], model(y, keep)[0, :11])


def test_a_padding_mask_without_padding_is_dropped_on_the_host_with_the_same_logits():
    """A corpus batch of full windows reaches the model with no mask (dropped where the batch is collated, so
    the forward reads no value), and attention given none builds and applies none; padding keeps its mask."""
    from harness.data.loaders import on_device, without_full_masks
    from positional.t5 import T5Bias

    torch.manual_seed(0)
    model, seen = build(pos=T5Bias), []
    model.blocks[0].attn.variant.register_forward_pre_hook(lambda m, args: seen.append(args[3].key_padding_mask))
    x = torch.randint(256, (2, 16))
    full, padded = torch.ones(2, 16, dtype=torch.bool), torch.arange(16).expand(2, 16) < 11
    batch = without_full_masks({"input_ids": x, "key_padding_mask": full})
    assert batch["key_padding_mask"] is None
    pairs = without_full_masks(
        {
            "plain": {"input_ids": x, "key_padding_mask": full},  # validation's pairs
            "shuffled": {"input_ids": x, "key_padding_mask": padded},
        }
    )
    assert pairs["plain"]["key_padding_mask"] is None and pairs["shuffled"]["key_padding_mask"] is padded
    assert on_device({"input_ids": x, "key_padding_mask": full}, "cpu")["key_padding_mask"] is None
    assert torch.equal(model(x, full), model(x)) and seen == [full, None]  # the model uses what it is given
    model(x, padded)
    assert torch.equal(seen[-1], padded)
    assert not torch.allclose(model(x, padded)[:, :11], model(x)[:, :11])


def test_without_positions_mlm_is_permutation_equivariant():
    torch.manual_seed(0)
    model = build(pos=NoPosition)
    x = torch.randint(256, (1, 16))
    perm = torch.randperm(16)
    torch.testing.assert_close(model(x)[0, perm], model(x[:, perm])[0], atol=1e-5, rtol=1e-5)
    rope = build(pos=Rope)
    assert not torch.allclose(rope(x)[0, perm], rope(x[:, perm])[0], atol=1e-4)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(d_model=30, n_heads=4), "not divisible"),
        (dict(n_layers=0), "positive"),
        (dict(dropout=1.0), "dropout"),
        (dict(norm="middle"), "norm"),
    ],
)
def test_model_config_refuses_bad_shapes(kw, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**kw)
