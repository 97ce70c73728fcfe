"""Transformer-XL relative encoding: the efficient shift equals the explicit O(T²) score."""

import math

import pytest
import torch

from positional.base import Shape
from positional.sinusoidal import sinusoidal_table
from positional.xl import TransformerXL, rel_shift, xl_offsets

F64 = torch.float64


@pytest.mark.parametrize("t_q,t_k,n_offsets", [(5, 5, 9), (5, 5, 5), (1, 4, 4), (3, 6, 8), (6, 6, 11)])
def test_rel_shift_moves_offsets_to_keys(t_q, t_k, n_offsets):
    x = torch.randn(2, t_q, n_offsets, dtype=F64)  # column c holds offset t_q − 1 − c
    out = rel_shift(x, t_k)
    assert out.shape == (2, t_q, t_k)
    for i in range(t_q):
        for j in range(t_k):
            c = t_q - 1 - i + j
            want = x[:, i, c] if c < n_offsets else torch.zeros(2, dtype=F64)
            torch.testing.assert_close(out[:, i, j], want, rtol=0, atol=0)


def explicit_logits(scheme: TransformerXL, q, k, layer: int) -> torch.Tensor:
    """A_ij / √D from Dai et al. §3.3, one (i, j) at a time: (q_i+u)·k_j + (q_i+v)·W_R R_{i−j}."""
    B, H, T, D = q.shape
    out = torch.empty(B, H, T, T, dtype=F64)
    w_r = scheme.w_r[layer].weight  # (C, C)
    for i in range(T):
        for j in range(T):
            r = sinusoidal_table(torch.tensor([i - j]), scheme.shape.d_model)[0]  # (C,)
            p = (w_r @ r).view(H, D)  # (H, D) W_R R_{i−j}, per head
            a = ((q[:, :, i] + scheme.u) * k[:, :, j]).sum(-1) + ((q[:, :, i] + scheme.v) * p).sum(-1)
            out[:, :, i, j] = a / math.sqrt(D)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_efficient_equals_explicit(causal):
    torch.manual_seed(0)
    scheme = TransformerXL(Shape(24, 3, 2, 64, causal), init_std=0.5).double()
    B, H, T, D = 2, 3, 7, 8
    q, k = torch.randn(B, H, T, D, dtype=F64), torch.randn(B, H, T, D, dtype=F64)
    for layer in range(2):
        bias = scheme.logit_bias(torch.arange(T), layer)
        assert bias.kind == "content"
        logits = q @ k.transpose(-1, -2) / math.sqrt(D) + bias.dense(q, k)  # what softmax attention computes
        want = explicit_logits(scheme, q, k, layer)
        keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
        torch.testing.assert_close(logits[..., keep], want[..., keep], rtol=0, atol=1e-12)
        assert torch.isfinite(logits).all()


def test_offsets_span_both_directions_for_mlm_and_the_past_for_clm():
    assert xl_offsets(4, causal=False).tolist() == [3, 2, 1, 0, -1, -2, -3]
    assert xl_offsets(4, causal=True).tolist() == [3, 2, 1, 0]


def test_the_bias_is_content_dai_eq_terms_b_and_d_read_the_query():
    """(q+u)·k and (q+v)·W_R R_{i−j} are made of q: no table of offsets can hold them (Dai et al. 2019, §3.3)."""
    assert TransformerXL.bias_kind == "content" and TransformerXL.hooks() == {"logit_bias"}


def test_u_v_are_shared_and_w_r_is_per_layer():
    scheme = TransformerXL(Shape(24, 3, 4, 64, False))
    assert scheme.u.shape == scheme.v.shape == (3, 8)
    assert len(scheme.w_r) == 4
