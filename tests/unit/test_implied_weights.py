"""Each attention variant's implied weights (``implied_weights``): the explicit float64 weights of an
independent reference, rows that sum to 1, local's band, and w @ v equal to the variant's own output."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.testing import assert_close

from attention.base import AttentionContext, AttentionVariant
from attention.kernelized import KernelizedAttention
from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.config.catalog import option_classes
from harness.config.load import load
from harness.paths import CONF
from positional.base import Shape
from tests.attn_cases import F64, ContentBias, allowed_pairs, padding, qkv, relative_bias, rotation, rotation_matrices

T, D, H = 13, 8, 2


def make(name: str, causal: bool, rope_mode: str = "pre_feature") -> AttentionVariant:
    torch.manual_seed(0)
    shape = Shape(D * H, H, 1, 64, causal)
    made = {
        "softmax": lambda: Softmax(shape, backend="math"),
        "local": lambda: Local(shape, window=4),
        "linear": lambda: Linear(shape, rope_mode),
        "performer": lambda: Performer(shape, nb_features=16, rope_mode=rope_mode),
    }
    assert name in made, f"attn={name} has no explicit reference here: add how to build it and its reference weights"
    return made[name]().double().eval()


def reference_softmax_weights(q, k, *, causal, keep, bias, rot, band=None):
    """exp(s_ij) / Σ_j' exp(s_ij') over the allowed pairs, s = (Rq)ᵀ(Rk)/√D + b; a row with none: 0."""
    if rot is not None:
        q, k = rot.rotate(q), rot.rotate(k)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias.dense(q, k)
    ok = allowed_pairs(q.shape[-2], causal, keep, band).expand_as(scores)
    e = torch.where(ok, torch.exp(scores - scores.amax(-1, keepdim=True)), 0.0)
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def reference_kernel_weights(variant, q, k, *, causal, keep, bias, rot, numerator):
    """c_ij s_ij / Σ_j c_ij φ(q_i)ᵀφ(k_j), c_ij = exp(b_{i−j})·[allowed], s the numerator's scores
    (with RoFormer Eq. 19's rotation matrices R_i applied to φ in numerator mode)."""
    if rot is not None and not numerator:
        q, k = rot.rotate(q), rot.rotate(k)
    if keep is not None:
        k = k.masked_fill(~keep[:, None, :, None], 0.0)
    phi_q, phi_k = variant.feature_map(q, is_query=True), variant.feature_map(k, is_query=False)
    if keep is not None:
        phi_k = phi_k.masked_fill(~keep[:, None, :, None], 0.0)
    den_scores = torch.einsum("bhim,bhjm->bhij", phi_q, phi_k)
    num_scores = den_scores
    if rot is not None and numerator:
        wide = rot.at_width(phi_q.shape[-1])
        R = rotation_matrices(wide.cos, wide.sin)  # (T, M, M)
        rq, rk = (torch.einsum("tmn,bhtn->bhtm", R, x) for x in (phi_q, phi_k))
        num_scores = torch.einsum("bhim,bhjm->bhij", rq, rk)
    c = allowed_pairs(q.shape[-2], causal, keep).to(F64)
    if bias is not None:
        c = c * bias.dense().exp()
    den = (c * den_scores).sum(-1, keepdim=True)
    return c * num_scores / torch.where(den > 0, den, 1.0)


# every conf/attn option (a new variant fails in make() until its reference is written); a kernelized one in both
# of its RoPE modes
KERNELIZED = {name for name, cls in option_classes("attn").items() if issubclass(cls, KernelizedAttention)}
CASES = [
    (name, causal, mode)
    for name in sorted(option_classes("attn"))
    for causal in (False, True)
    for mode in (("pre_feature", "numerator") if name in KERNELIZED else ("pre_feature",))
]


@pytest.mark.parametrize("with_rope", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("name,causal,rope_mode", CASES)
def test_implied_weights_equal_the_explicit_reference_and_reproduce_the_output(
    name, causal, rope_mode, with_bias, with_rope
):
    variant = make(name, causal, rope_mode)
    q, k, v = qkv(B=2, H=H, T=T, D=D, scale=0.7)
    keep = padding(2, T)
    bias = relative_bias(H, T) if with_bias else None
    rot = rotation(T, D) if with_rope else None
    ctx = AttentionContext(rotary=rot, bias=bias, causal=causal, key_padding_mask=keep)
    w = variant.implied_weights(q, k, ctx)
    assert w.shape == (2, H, T, T) and w.dtype == F64
    band = ((3, 0) if causal else (2, 2)) if name == "local" else None  # window 4
    if name not in KERNELIZED:
        ref = reference_softmax_weights(q, k, causal=causal, keep=keep, bias=bias, rot=rot, band=band)
    else:
        ref = reference_kernel_weights(
            variant, q, k, causal=causal, keep=keep, bias=bias, rot=rot, numerator=rope_mode == "numerator"
        )
    assert_close(w, ref, rtol=1e-10, atol=1e-12)
    assert_close(w @ v, variant(q, k, v, ctx), rtol=1e-10, atol=1e-10)  # the weights the variant applies

    signed = rope_mode == "numerator" and with_rope  # RoFormer Eq. 19 rotates the numerator only
    if not signed:
        assert (w >= 0).all()
        sees_a_key = allowed_pairs(T, causal, keep, band).any(-1).expand(2, H, T).to(F64)  # else a zero row
        assert_close(w.sum(-1), sees_a_key, rtol=1e-12, atol=1e-12)
    if name == "local":
        offset = torch.arange(T)[:, None] - torch.arange(T)[None, :]
        outside = (offset > (3 if causal else 2)) | (offset < (0 if causal else -2))
        assert (w[..., outside] == 0).all()
    if causal:
        assert (w[..., torch.ones(T, T, dtype=torch.bool).triu(1)] == 0).all()


def test_softmax_honours_a_content_bias_and_rows_without_keys_are_zero():
    variant = make("softmax", causal=True)
    q, k, v = qkv(B=2, H=H, T=T, D=D)
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[1, :4] = False  # left padding under a causal mask: queries 0…3 of row 1 see no key
    ctx = AttentionContext(bias=ContentBias(), causal=True, key_padding_mask=keep)
    w = variant.implied_weights(q, k, ctx)
    assert_close(
        w, reference_softmax_weights(q, k, causal=True, keep=keep, bias=ContentBias(), rot=None), rtol=1e-10, atol=1e-12
    )
    assert (w[1, :, :4] == 0).all() and torch.isfinite(w).all()
    assert_close(w @ v, variant(q, k, v, ctx), rtol=1e-10, atol=1e-10)


def test_a_variant_without_implied_weights_says_so():
    class Opaque(AttentionVariant):
        def forward(self, q, k, v, ctx):
            return v

    assert not Opaque.implies_weights()
    q, k, _ = qkv(B=1, H=1, T=4, D=2)
    with pytest.raises(NotImplementedError, match="implied_weights.*set diagnostics=false"):
        Opaque(Shape(2, 1, 1, 4, False)).implied_weights(q, k, AttentionContext())


@functools.cache
def choice(group: str, option: str):
    """conf/<group>/<option>.yaml loaded (its interpolations resolved): one load per option, not per pair."""
    return getattr(load([f"{group}={option}"]), group)


def pairings():
    """Every conf/pos × conf/attn option the variant accepts, as built from its YAML."""
    out = []
    for pos in sorted(p.stem for p in (CONF / "pos").glob("*.yaml")):
        for attn in sorted(option_classes("attn")):
            out.append((pos, attn))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pos,attn", pairings())
def test_every_scheme_with_every_variant_applies_its_implied_weights(pos, attn, causal):
    """With the scheme's own hooks (rotation, per-layer bias), as the model hands them over."""
    torch.manual_seed(0)
    if not causal and option_classes("pos")[pos].bidirectional_refusal:
        pytest.skip(option_classes("pos")[pos].bidirectional_refusal)  # FoX: defined for causal attention only
    shape = Shape(D * H, H, 1, 32, causal)
    scheme, variant = (
        choice(group, name).factory()(shape).double().eval() for group, name in (("pos", pos), ("attn", attn))
    )
    if variant.refusal(type(scheme)):
        pytest.skip(variant.refusal(type(scheme)))
    positions = torch.arange(T)
    x = torch.randn(2, T, D * H, dtype=torch.float64)  # the layer input a bias may read (FoX's gates)
    bias = scheme.logit_biases(positions, 1)[0]
    if bias is not None:  # what the model's attention does before calling the variant
        bias = bias.for_input(x)
    if bias is not None and bias.kind == "relative":
        bias.table = bias.table.double()
    q, k, v = qkv(B=2, H=H, T=T, D=D, scale=0.7)
    ctx = AttentionContext(rotary=scheme.rotary(positions), bias=bias, causal=causal, key_padding_mask=padding(2, T))
    with torch.no_grad():
        assert_close(variant.implied_weights(q, k, ctx) @ v, variant(q, k, v, ctx), rtol=1e-9, atol=1e-9)
