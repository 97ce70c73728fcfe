"""The compatibility matrix: from declarations, consistent with check_pairing, rendered for humans."""

import re
from functools import partial

import pytest
import torch

from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.config.catalog import option_classes
from harness.config.compat import Pairing, compatibility, print_matrix, render_markdown, render_text
from harness.errors import ConfigError
from harness.model.transformer import ModelConfig, Transformer
from positional.base import PositionalScheme, RelativeBias


class RelativeScheme(PositionalScheme):
    """Stands in for T5/ALiBi: a Toeplitz bias."""

    bias_kind = "relative"

    def logit_bias(self, positions, layer):
        T = positions.shape[0]
        return RelativeBias(torch.zeros(self.shape.n_heads, 2 * T - 1), T, T)


class ContentScheme(PositionalScheme):
    """Stands in for Transformer-XL: a bias that depends on q."""

    bias_kind = "content"


# Written from the papers, not from the code: softmax forms every logit, so it takes any bias. Local
# (a band of logits) and kernelized attention (no logits, Toeplitz products) take biases of i − j only.
# Each scheme's own test asserts its bias kind from its paper (XL and CoPE add terms made of q: content;
# FIRE reads i as well as i − j: positional); the matrix follows from those declarations.
FROM_THE_PAPERS = {
    "softmax": {"relative", "positional", "content"},
    "local": {"relative"},
    "linear": {"relative"},
    "performer": {"relative"},
}
# Softmax and the band form q̃ᵀk̃ at whatever width the scheme hands them (PoPE's 2D); kernelized attention applies
# a feature map built for the head dim instead.
TAKES_WIDE_ROTARY = {"softmax": True, "local": True, "linear": False, "performer": False}


def test_the_matrix_refuses_exactly_the_cells_whose_bias_or_widened_queries_the_variant_cannot_take():
    schemes, variants = option_classes("pos"), option_classes("attn")
    cells = compatibility()
    assert {(c.pos, c.attn) for c in cells} == {(p, a) for p in schemes for a in variants}
    for c in cells:  # an attention option added since: what it declares
        kind, accepts = schemes[c.pos].bias_kind, FROM_THE_PAPERS.get(c.attn, variants[c.attn].accepts_bias)
        wide = TAKES_WIDE_ROTARY.get(c.attn, variants[c.attn].wide_rotary_refusal is None)
        if kind != "none" and kind not in accepts:
            assert f"cannot apply a {kind} logit bias (pos={c.pos}): " in c.refusal
        elif schemes[c.pos].rotary_widens and not wide:
            assert f"cannot apply queries and keys widened by pos={c.pos}: " in c.refusal
        else:
            assert c.allowed, c


@pytest.mark.parametrize("variant", [Local, Linear, Performer])
def test_content_bias_is_refused_with_a_one_line_reason_and_relative_accepted(variant):
    reason = variant.refusal(ContentScheme)
    assert reason and "\n" not in reason
    assert re.search(r"cannot apply a content logit bias \(pos=test_compat\): .+; choose another", reason)
    assert variant.refusal(RelativeScheme) is None
    assert Softmax.refusal(ContentScheme) is None and Softmax.refusal(RelativeScheme) is None


def test_refused_pairing_fails_when_the_model_is_built():
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=16)
    with pytest.raises(ConfigError, match="incompatible pairing: attn=performer cannot apply a content"):
        Transformer(cfg, 10, 16, False, pos=ContentScheme, attn=partial(Performer))
    model = Transformer(cfg, 10, 16, True, pos=RelativeScheme, attn=partial(Linear))  # allowed: it runs
    assert model(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 10)


def test_renderings_list_every_option_and_number_the_reasons():
    cells = [
        Pairing("rope", "softmax", None),
        Pairing("xl", "softmax", None),
        Pairing("rope", "linear", None),
        Pairing("xl", "linear", "attn=linear cannot apply a content logit bias"),
    ]
    text, md = render_text(cells), render_markdown(cells)
    assert "refused [1]" in text and "[1] attn=linear cannot apply a content logit bias" in text
    assert "| `xl` | ✓ | ✗ [1] |" in md and "1. attn=linear cannot apply a content logit bias" in md
    assert md.splitlines()[0] == "| pos \\ attn | `softmax` | `linear` |"


def test_print_matrix_formats(capsys):
    assert print_matrix("--matrix") == 0
    out = capsys.readouterr().out
    assert all(name in out for name in option_classes("attn"))
    assert print_matrix("--matrix=md") == 0 and capsys.readouterr().out.startswith("| pos \\ attn |")
    with pytest.raises(ConfigError, match="unknown matrix format 'html'; use --matrix or --matrix=md"):
        print_matrix("--matrix=html")  # run.py prints it on stderr (harness/cli.py _guarded)


@pytest.mark.parametrize("target", ["builtins.dict", "math.sqrt"])
def test_matrix_refuses_a_named_class_that_is_no_scheme_as_list_does(target):
    """``--matrix pos._target_=X`` names X's group and interface in one line, whatever X is (a function too)."""
    with pytest.raises(ConfigError, match=rf"^pos._target_={re.escape(target)} is not a positional scheme: "):
        print_matrix("--matrix", [f"pos._target_={target}"])
