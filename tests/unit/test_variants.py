"""Every conf/attn option: built from its YAML, padded keys cannot reach real outputs."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.testing import assert_close

from attention.base import AttentionContext
from harness.config.catalog import option_classes
from harness.paths import CONF
from positional.base import Shape
from tests.attn_cases import F64, padding, qkv, relative_bias, rotation

T, D, H = 37, 8, 2


def build(name: str, causal: bool):
    torch.manual_seed(0)
    return instantiate(OmegaConf.load(CONF / "attn" / f"{name}.yaml"))(Shape(D * H, H, 1, 64, causal)).double().eval()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(option_classes("attn")))
def test_padded_keys_and_values_cannot_change_real_outputs(name, causal):
    variant = build(name, causal)
    q, k, v = qkv(B=2, H=H, T=T, D=D)
    keep = padding(2, T)  # (B, T): row 0 right-padded, row 1 left-padded
    bias = relative_bias(H, T) if "relative" in variant.accepts_bias else None
    ctx = AttentionContext(rotary=rotation(T, D), bias=bias, causal=causal, key_padding_mask=keep)
    out = variant(q, k, v, ctx)

    g = torch.Generator().manual_seed(5)
    pad = ~keep[:, None, :, None]  # (B, 1, T, 1)
    k2 = torch.where(pad, 50 * torch.randn(k.shape, generator=g, dtype=F64), k)
    v2 = torch.where(pad, 1e3 * torch.randn(v.shape, generator=g, dtype=F64), v)
    out2 = variant(q, k2, v2, ctx)
    real = keep[:, None, :, None].expand_as(out)
    assert torch.isfinite(out2).all()
    assert_close(out2[real], out[real], rtol=1e-9, atol=1e-9)
