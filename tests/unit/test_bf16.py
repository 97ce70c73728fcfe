"""bf16 autocast (trainer.precision=bf16-mixed, every paper-scale preset's precision) against fp32.

Tolerances are in units of u = 2⁻⁸, bf16's unit roundoff: bf16 keeps 8 significant bits, so rounding a
value to bf16 moves it by at most u relative (≈ 0.39 %). Under ``torch.autocast`` the weights stay fp32
and every matrix product rounds its two operands to bf16 and returns bf16 (the sums are accumulated in
fp32); the elementwise work between them (norms, softmax, the positional maths) runs in fp32 or wider.

1. A training step of every allowed pos × attn pairing (conf/pos × conf/attn, enumerated: a new scheme or
   variant adds its cells) bidirectionally, and of every scheme causally with a padded row: the same weights
   and batch in fp32 and under bf16 autocast, compared on the loss, the logits and the gradient. The step is
   taken after 3 fp32 AdamW steps, so the logits are no longer ~0 (at initialisation the loss is ln V
   whatever the precision) and the gradient is not yet a small difference of large terms (near a
   minimum its relative error grows as its norm shrinks, which says nothing about precision).
   - loss: |Δ| ≤ u·loss. The loss is computed in fp32 from logits that carry about one rounding (the LM
     head's product returns bf16), and cross-entropy averages the logits' independent errors.
   - logits: ‖Δz‖ ≤ 4u·‖z‖: a few roundings on the path (the head's output, its inputs, the layer below);
     errors of independent sign add in quadrature rather than in sum.
   - gradient: ‖Δg‖ ≤ 4u·‖g‖ over all parameters together, as for the logits it flows back from; so its norm,
     which gradient clipping reads, agrees within 4u too (|‖a‖ − ‖b‖| ≤ ‖a − b‖).
     Not per parameter: one whose exact gradient is 0 (a bias added to every logit of a row, which softmax
     ignores: FIRE's last MLP bias) holds only rounding noise in fp32 and in bf16 alike.
2. Rotary angles at positions ≥ 8192 (every scheme with a ``rotary`` hook, and pos=rope under each length
   scaling; and in a model converted to bf16, trainer.precision=bf16-true): bf16 holds 8192…8192+T only to a
   multiple of 32, and m·θ_0 = m rad, so an angle computed in bf16 there is off by radians. Each scheme's
   queries and keys, rounded to bf16 as autocast hands them over, are
   rotated under autocast at 8192…8192+T and their scores compared with the same scores in float64 at
   0…T−1: RoFormer's Eq. 16 (xPos: its scales too) makes q_m·k_n depend on m − n only. The rotated vectors
   are bf16 (cos and sin rounded once, each product and sum once), so a score is off by at most ~4u·‖q‖‖k‖;
   angles in fp32 would add ~0.1u at 8192 (m·2⁻²⁴ rad), angles in bf16 tens of u: a control computes RoPE's
   angles in bf16 and must fail the check by 10×.
3. A logit bias at positions ≥ 8192 in a model cast to bf16 (bf16-true): FIRE subtracts positions, which bf16
   holds 32 apart there; the bias is compared with the same bf16 weights evaluated in float64.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F

from harness.bench.internals import compose_cell
from harness.config.catalog import option_classes
from harness.config.compat import compatibility
from harness.data.objectives import IGNORE
from harness.errors import ConfigError
from harness.model.transformer import Transformer
from positional.base import Shape
from positional.rope_scaling import METHODS

U = 2.0**-8  # bf16's unit roundoff
T, VOCAB = 32, 258
TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.dropout=0.0",
    f"data.seq_len={T}",
]
ALLOWED = [(c.pos, c.attn) for c in compatibility() if c.allowed]
CAUSAL_ATTN = "softmax"  # every scheme pairs with it
# a scheme defined for causal attention only (bidirectional_refusal: FoX) refuses the bidirectional cells
BIDIRECTIONAL = [(pos, attn) for pos, attn in ALLOWED if option_classes("pos")[pos].bidirectional_refusal is None]
CELLS = [(pos, attn, False) for pos, attn in BIDIRECTIONAL] + [
    (pos, CAUSAL_ATTN, True) for pos in dict.fromkeys(p for p, _ in ALLOWED)
]


@functools.cache
def _spec(group: str, option: str):
    """conf/<group>/<option>.yaml loaded with TINY, once per option (composing is not free); a windowed
    variant gets a window inside the short sequence."""
    spec = compose_cell([f"{group}={option}", *TINY])
    if "window" in getattr(spec, group).option.kwargs:
        spec = compose_cell([f"{group}={option}", *TINY, f"{group}.window={T // 2}"])
    return spec


def _model(pos: str, attn: str, causal: bool):
    """posbench's model of the cell, built as harness/bench/internals.py ``build_transformer`` builds it."""
    spec = _spec("pos", pos)
    return Transformer(spec.model, VOCAB, T, causal, pos=spec.pos.factory(), attn=_spec("attn", attn).attn.factory())


def _step(model, ids, labels, mask, bf16: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, logits, gradients) of one training step as harness/model/module.py takes it, in float64 copies."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids, mask)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().double(), logits.detach().double(), grads


@pytest.mark.parametrize("pos,attn,causal", CELLS, ids=[f"{p}-{a}-{'clm' if c else 'mlm'}" for p, a, c in CELLS])
def test_training_step_under_bf16_autocast_matches_fp32(pos, attn, causal):
    torch.manual_seed(0)
    model = _model(pos, attn, causal).train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(8, (4, T), generator=gen)  # 8 symbols: a batch the model starts to fit in 3 steps
    labels = ids.roll(-1, 1) if causal else ids.clone()
    mask = None
    if causal:  # row 1 padded after T − 5 tokens, as the loaders hand a short document over
        mask = torch.arange(T) < torch.tensor([[T], [T - 5], [T], [T]])
        labels[~mask] = IGNORE
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        _step(model, ids, labels, mask, bf16=False)
        optimizer.step()

    loss32, logits32, grads32 = _step(model, ids, labels, mask, bf16=False)
    loss16, logits16, grads16 = _step(model, ids, labels, mask, bf16=True)

    assert loss32 < 0.9 * torch.log(torch.tensor(float(VOCAB))), "the model did not move off its initial loss"
    assert grads16.keys() == grads32.keys()
    assert abs(loss16 - loss32) <= U * loss32, f"loss {loss16:.6f} vs fp32 {loss32:.6f}"
    assert (logits16 - logits32).norm() <= 4 * U * logits32.norm(), (
        f"logits off by {((logits16 - logits32).norm() / logits32.norm() / U):.2f}u"
    )
    whole = torch.cat([g.flatten() for g in grads32.values()]).norm()
    diff = torch.cat([(grads16[n] - g).flatten() for n, g in grads32.items()]).norm()
    assert diff <= 4 * U * whole, f"gradient off by {diff / whole / U:.2f}u of its norm"


def test_every_allowed_pairing_and_every_scheme_causally_is_a_cell():
    """A new YAML in conf/pos or conf/attn adds its cells here."""
    assert {(p, a) for p, a, c in CELLS if not c} == set(BIDIRECTIONAL)
    assert {p for p, a, c in CELLS if c} == set(option_classes("pos"))


# ---------------------------------------------------------------- 2. rotary angles at positions ≥ 8192

FAR = 8192  # bf16 spaces integers here 32 apart
FAR_TOL = 4  # u: cos and sin rounded to bf16 once, each product and sum once, over the pair's two terms
T_FAR, HEAD_DIM = 64, 64
ROTARY = sorted(name for name, cls in option_classes("pos").items() if "rotary" in cls.hooks())
LONGROPE_LISTS = {"short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": [float(1 + i) for i in range(HEAD_DIM // 2)]}
SCALINGS = [m for m in METHODS if m != "none"]


def _scheme(name: str, scaling: str | None = None):
    """conf/pos/<name>.yaml's scheme for one head of width 64, trained at 16 positions (so a scaling applies)."""
    overrides = [f"pos={name}"]
    if scaling:
        overrides += [f"pos/scaling={scaling}", "pos.scaling.original_max_len=16"]
        overrides += ["pos.scaling.factor=4.0"] if scaling not in ("dynamic_ntk",) else []
        overrides += [
            f"pos.scaling.{k}=[{','.join(map(str, v))}]" for k, v in LONGROPE_LISTS.items() if scaling == "longrope"
        ]
    scheme = compose_cell(overrides).pos.factory()(Shape(HEAD_DIM, 1, 1, 16, True))
    return scheme.eval() if scaling else scheme.train()  # a length scaling applies at evaluation


def _scores(scheme, q: torch.Tensor, k: torch.Tensor, start: int, width: int | None, bf16: bool) -> torch.Tensor:
    """q_m·k_n (T, T) in float64 after the scheme's rotation at positions start … start+T−1 (at ``width``:
    kernelized attention's rotation of φ(q), φ(k)), taken under bf16 autocast or in float64."""
    positions = torch.arange(start, start + q.shape[-2])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        rotary = scheme.rotary(positions)
        if width is not None:
            rotary = rotary.at_width(width)
        x = (lambda t: t) if bf16 else (lambda t: t.double())
        rq, rk = rotary.rotate_q(x(q)), rotary.rotate_k(x(k))
    rq, rk = (r.detach().double().reshape(q.shape[-2], -1) for r in (rq, rk))  # (T, W) each (PoPE: (T, 2W))
    return rq @ rk.T, rq.norm(dim=-1), rk.norm(dim=-1)


def _far_error(scheme, width: int | None = None, cast: bool = False) -> float:
    """max |score at 8192+ under autocast − score at 0+ in float64| / (‖q‖‖k‖), in units of u. ``cast``: the scheme
    converted to bf16 first (trainer.precision=bf16-true: the whole model in bf16, no autocast)."""
    gen = torch.Generator().manual_seed(0)
    w = width or HEAD_DIM
    q, k = (torch.randn(T_FAR, w, generator=gen).bfloat16() for _ in range(2))  # as an autocast linear returns
    near, q_norm, k_norm = _scores(scheme, q, k, 0, width, bf16=False)
    far, _, _ = _scores(scheme.to(torch.bfloat16) if cast else scheme, q, k, FAR, width, bf16=True)
    return float(((far - near).abs() / (q_norm[:, None] * k_norm[None, :])).max() / U)


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_scores_at_position_8192_under_autocast_match_float64(name):
    assert _far_error(_scheme(name)) <= FAR_TOL


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_scores_at_position_8192_in_a_bf16_model_match_float64(name):
    """trainer.precision=bf16-true casts every floating tensor of the model to bf16: RoPE's θ buffer (and
    rope_trainable's learned θ) keep float64 (positional/rope.py ``_apply``), or m·θ would be off by radians."""
    assert _far_error(_scheme(name), cast=True) <= FAR_TOL


def test_a_bf16_model_keeps_theta_in_float64_and_moves_it():
    scheme = _scheme("rope_trainable").to(torch.bfloat16).to("meta")
    assert {n: (t.dtype, t.device.type) for n, t in [*scheme.named_parameters(), *scheme.named_buffers()]} == {
        "inv_freq": (torch.float64, "meta"),
        "theta0": (torch.float64, "meta"),
    }


@pytest.mark.parametrize("scaling", SCALINGS)
def test_rope_scaled_scores_at_position_8192_under_autocast_match_float64(scaling):
    assert _far_error(_scheme("rope", scaling)) <= FAR_TOL


@pytest.mark.parametrize("name", [n for n in ROTARY if not option_classes("pos")[n].rotary_widens])  # PoPE: refused
def test_rotary_at_a_feature_width_at_position_8192_matches_float64(name):
    """The rotation kernelized attention applies to φ(q), φ(k) (RoFormer Eq. 19) at twice the head width."""
    scheme = _scheme(name)
    try:
        scheme.rotary(torch.arange(T_FAR)).at_width(2 * HEAD_DIM)
    except ConfigError as e:  # pos=rope_trainable learned θ for the head width alone, and says so
        assert "rotated dims" in str(e)
        return
    assert _far_error(scheme, 2 * HEAD_DIM) <= FAR_TOL


def test_angles_computed_in_bf16_fail_the_check(monkeypatch):
    """The control: RoPE's m·θ rounded to bf16 (as an outer product under autocast would make it) is off by
    radians at 8192, and the check above sees it."""
    import positional.rope as rope

    exact = rope.rope_angles
    monkeypatch.setattr(rope, "rope_angles", lambda p, th: exact(p.bfloat16(), th.bfloat16()).to(th.dtype))
    assert _far_error(_scheme("rope")) > 10 * FAR_TOL


BIASED = sorted(
    name for name, cls in option_classes("pos").items() if "logit_bias" in cls.hooks() and cls.bias_kind != "content"
)  # a content bias reads q and k too


@pytest.mark.parametrize("name", BIASED)
def test_logit_bias_at_position_8192_in_a_bf16_model_matches_float64(name):
    """trainer.precision=bf16-true casts the scheme's parameters to bf16: a bias computed from positions must keep
    their spacing (FIRE reads p_i − p_j, and bf16 spaces integers past 256 two or more apart). Against the same
    bf16 weights evaluated in float64, so only the arithmetic differs: within 4u of the bias's largest value."""
    low = _scheme(name).to(torch.bfloat16)
    ref = copy.deepcopy(low).double()
    positions = torch.arange(FAR, FAR + T_FAR)
    b16, b64 = (scheme.logit_bias(positions, 0).dense().detach().double() for scheme in (low, ref))
    assert b64.abs().max() > 0
    assert (b16 - b64).abs().max() <= FAR_TOL * U * b64.abs().max()


def test_sinusoidal_table_at_position_8192_under_autocast_matches_float64():
    """The absolute table too: PE(m, 2i) = sin(m / 10000^(2i/C)) at m ≥ 8192, added in the embeddings' fp32."""
    scheme = _scheme("sinusoidal")
    positions = torch.arange(FAR, FAR + T_FAR)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        table = scheme.embed(torch.zeros(1, T_FAR, HEAD_DIM), positions)[0]  # (T, C)
    i = torch.arange(0, HEAD_DIM, 2, dtype=torch.float64)
    angles = positions.double()[:, None] / 10000.0 ** (i / HEAD_DIM)[None, :]  # (T, C/2)
    expected = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    assert table.dtype == torch.float32
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=2**-22)  # fp32's rounding of |x| ≤ 1
