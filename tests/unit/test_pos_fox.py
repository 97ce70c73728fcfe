"""FoX (Lin et al. 2025) and data-dependent ALiBi (x-transformers): the forget-gate bias against explicit sums in
float64, parity with x-transformers' DataDependentAlibi, the gates read the layer's attention input, the gate
parameters train and are checkpointed, and the refusals (bidirectional FoX, efficient attention, randomize)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.errors import ConfigError, IncompatiblePairing
from harness.model.transformer import ModelConfig, Transformer
from positional.base import Shape
from positional.dd_alibi import DataDependentALiBi
from positional.fox import ForgettingTransformer, forget_bias, two_way_forget_bias
from positional.randomized import randomized
from tests.attn_cases import F64, qkv

B, H, T, D = 2, 3, 9, 4
C = H * D


def log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z))


def explicit(x, weight, bias, causal: bool, scale: float = 1.0):
    """b_ij one entry at a time: log f_t = s·log σ(w_h·x_t + b_h) summed over the gates t = j+1 … i between key and
    query; keys after the query (bidirectional) sum the backward gates t = i+1 … j."""
    out = torch.zeros(x.shape[0], H, T, T, dtype=F64)
    for b in range(x.shape[0]):
        for h in range(H):

            def log_f(row, t, b=b):
                return scale * log_sigmoid(float(weight[row] @ x[b, t] + bias[row]))

            for i in range(T):
                for j in range(T):
                    if j <= i:
                        out[b, h, i, j] = sum(log_f(h, t) for t in range(j + 1, i + 1))
                    elif not causal:
                        out[b, h, i, j] = sum(log_f(H + h, t) for t in range(i + 1, j + 1))
    return out


def inputs(seed=0):
    return torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_forget_bias_sums_the_log_gates_between_key_and_query():
    log_f = -torch.rand(2, 3, T, dtype=F64)
    got = forget_bias(log_f)
    for i in range(T):
        for j in range(i + 1):
            assert_close(got[..., i, j], log_f[..., j + 1 : i + 1].sum(-1), rtol=0, atol=1e-14)
    assert (got.diagonal(dim1=-2, dim2=-1) == 0).all() and (got.tril() <= 0).all()  # decays, never raises
    log_g = -torch.rand(2, 3, T, dtype=F64)
    both = two_way_forget_bias(log_f, log_g)
    ahead = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert_close(both[..., ~ahead], got[..., ~ahead], rtol=0, atol=0)
    for i in range(T):
        for j in range(i + 1, T):
            assert_close(both[..., i, j], log_g[..., i + 1 : j + 1].sum(-1), rtol=0, atol=1e-14)


def test_forget_bias_gradients_are_autograds_of_the_plain_differences():
    log_f, log_g = (-torch.rand(2, 3, T, dtype=F64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(forget_bias, (log_f,))
    assert torch.autograd.gradcheck(two_way_forget_bias, (log_f, log_g))
    weights = torch.randn(2, 3, T, T, dtype=F64)
    cum = log_f.cumsum(-1)
    (want,) = torch.autograd.grad(((cum[..., :, None] - cum[..., None, :]) * weights).sum(), log_f)
    (got,) = torch.autograd.grad((forget_bias(log_f) * weights).sum(), log_f)
    assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    "cls,causal", [(ForgettingTransformer, True), (DataDependentALiBi, True), (DataDependentALiBi, False)]
)
def test_bias_of_each_layer_equals_the_explicit_form(cls, causal):
    torch.manual_seed(0)
    s = cls(Shape(C, H, 2, 32, causal), init_std=0.5, bias_init=1.5).double()
    x = inputs()
    for layer in range(2):
        gate = s.gates[layer]
        got = s.logit_bias(torch.arange(T), layer).for_input(x).dense(None, None)
        want = explicit(x, gate.weight.detach(), gate.bias.detach(), causal, s.post_log_scale)
        keep = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
        assert_close(got[..., keep], want[..., keep], rtol=1e-12, atol=1e-12)
    assert s.gates[0].weight.shape == (H * (1 if causal else 2), C)  # one projection per layer, H (or 2H) gates
    assert not torch.equal(s.gates[0].weight, s.gates[1].weight)


@pytest.mark.parametrize("causal,pad", [(True, "right"), (True, "left"), (False, "left"), (False, "right")])
def test_inputs_at_padded_positions_do_not_change_the_bias_between_real_tokens(causal, pad):
    """Pads sit at the ends, so no gate between a real query and a real key is a pad's."""
    torch.manual_seed(9)
    s = DataDependentALiBi(Shape(C, H, 1, 32, causal), init_std=0.5).double()
    real = torch.arange(3, T) if pad == "left" else torch.arange(T - 3)
    x = inputs(10)
    x2 = x.clone()
    x2[:, [t for t in range(T) if t not in real.tolist()]] = 9.0
    a, b = (
        s.logit_bias(torch.arange(T), 0).for_input(xx).dense(None, None)[..., real[:, None], real[None, :]]
        for xx in (x, x2)
    )
    keep = torch.ones(len(real), len(real), dtype=torch.bool)
    keep = keep.tril() if causal else keep
    assert_close(a[..., keep], b[..., keep], rtol=0, atol=1e-12)  # differences of running sums: round-off only


def test_log_gates_and_their_sums_are_float32_under_bf16_autocast():
    s = ForgettingTransformer(Shape(C, H, 1, 32, True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bias = s.logit_bias(torch.arange(T), 0).for_input(torch.randn(B, T, C))
        assert bias.log_f.dtype == torch.float32 and bias.dense(None, None).dtype == torch.float32


def test_the_bias_needs_the_layer_input():
    bias = ForgettingTransformer(Shape(C, H, 1, 32, True)).logit_bias(torch.arange(T), 0)
    with pytest.raises(RuntimeError, match="call for_input"):
        bias.dense(None, None)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("post_log_scale", [1.0, 0.5])
def test_matches_x_transformers_data_dependent_alibi(causal, post_log_scale):
    from x_transformers.x_transformers import DataDependentAlibi

    torch.manual_seed(1)
    theirs = DataDependentAlibi(C, H, causal=causal, post_log_scale=post_log_scale).double()
    ours = DataDependentALiBi(Shape(C, H, 1, 64, causal), post_log_scale=post_log_scale).double()
    linear = theirs.to_forget_gates[0]
    assert_close(linear.bias, torch.full_like(linear.bias, 5.0))  # both start their gates' bias at 5
    assert_close(ours.gates[0].bias, linear.bias)
    with torch.no_grad():
        ours.gates[0].weight.copy_(linear.weight)
    x = 3 * torch.randn(B, 48, C, dtype=F64)
    want = theirs(x)
    got = ours.logit_bias(torch.arange(48), 0).for_input(x).dense(None, None)
    keep = torch.ones(48, 48, dtype=torch.bool).tril() if causal else torch.ones(48, 48, dtype=torch.bool)
    assert (got[..., keep] - want[..., keep]).abs().max() < 1e-12  # cumulative sums of 48 log-gates, float64


def test_fox_starts_as_the_paper_code_and_dd_alibi_as_x_transformers():
    torch.manual_seed(2)
    fox = ForgettingTransformer(Shape(256, 4, 2, 32, True))
    assert (fox.gates[1].bias == 0).all() and abs(fox.gates[1].weight.std().item() - 0.02) < 0.002
    dd = DataDependentALiBi(Shape(256, 4, 2, 32, True))
    bound = 1 / math.sqrt(256)  # torch's default Linear init: U(−1/√C, 1/√C)
    assert (dd.gates[0].bias == 5).all() and dd.gates[0].weight.abs().max() <= bound


def tiny_model(pos, n_layers=1, causal=True, norm="pre"):
    cfg = ModelConfig(n_layers=n_layers, d_model=C, n_heads=H, d_ff=16, dropout=0.0, norm=norm)
    return Transformer(cfg, 11, 32, causal, pos=pos, attn=lambda shape: Softmax(shape, backend="math"))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_gates_read_the_attention_input_of_their_layer(norm):
    """The bias attention receives is the one made from the tensor q, k, v are projected from: the normed
    residual stream under pre-LN, the stream itself under post-LN."""
    torch.manual_seed(3)
    model = tiny_model(lambda shape: ForgettingTransformer(shape, init_std=0.3), n_layers=2, norm=norm).double()
    seen = {}
    for layer, block in enumerate(model.blocks):
        block.attn.register_forward_pre_hook(lambda m, args, layer=layer: seen.__setitem__(("x", layer), args[0]))
        block.attn.variant.register_forward_pre_hook(
            lambda m, args, layer=layer: seen.__setitem__(("bias", layer), args[3].bias)
        )
    model(torch.randint(0, 11, (B, T)))
    for layer in range(2):
        gate = model.pos.gates[layer]
        want = explicit(seen["x", layer].detach(), gate.weight.detach(), gate.bias.detach(), causal=True)
        got = seen["bias", layer].dense(None, None).detach()
        assert_close(got.tril(), want, rtol=1e-12, atol=1e-12)


def test_softmax_attention_applies_the_bias_as_forgetting_attention():
    """Softmax attention with the bias is softmax(q·k/√D + D) with the causal mask (Lin et al. 2025, §2)."""
    torch.manual_seed(4)
    s = ForgettingTransformer(Shape(C, H, 1, 32, True), init_std=0.5).double()
    x = inputs(5)
    q, k, v = qkv(B=B, H=H, T=T, D=D, seed=6)
    bias = s.logit_bias(torch.arange(T), 0).for_input(x)
    from attention.base import AttentionContext

    got = Softmax(s.shape, backend="math")(q, k, v, AttentionContext(bias=bias, causal=True))
    logits = q @ k.transpose(-1, -2) / math.sqrt(D) + explicit(
        x, s.gates[0].weight.detach(), s.gates[0].bias.detach(), causal=True
    )
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(got, logits.softmax(-1) @ v, rtol=1e-12, atol=1e-12)


def test_gate_parameters_receive_gradients_from_the_loss():
    torch.manual_seed(5)
    model = tiny_model(ForgettingTransformer, n_layers=2)
    ids = torch.randint(0, 11, (B, T))
    F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    for gate in model.pos.gates:
        assert gate.weight.grad.abs().sum() > 0 and gate.bias.grad.abs().sum() > 0
    names = set(model.state_dict())
    assert {"pos.gates.0.weight", "pos.gates.0.bias", "pos.gates.1.weight", "pos.gates.1.bias"} <= names


def test_the_optimizer_steps_the_gates_and_a_checkpoint_restores_them(tmp_path):
    """Through the harness's LightningModule: its optimizer holds the gates (three steps move them, Adam keeps
    state for every parameter), and Lightning's checkpoint saves them and loads them back."""
    import lightning as L

    from harness.config.load import load
    from harness.model.module import LanguageModel

    def module(seed):
        torch.manual_seed(seed)
        spec = load(["pos=fox", "task=clm"])
        return LanguageModel(
            tiny_model(ForgettingTransformer, n_layers=2),
            spec.optimizer.factory(),
            spec.schedule.build(),
            bytes_per_token=None,
        )

    trained = module(6)
    before = [g.weight.detach().clone() for g in trained.model.pos.gates]
    ids = torch.randint(0, 11, (4, 4, T), generator=torch.Generator().manual_seed(7))
    batches = [{"input_ids": b[:, :-1], "key_padding_mask": None, "labels": b[:, 1:]} for b in ids]
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(trained, torch.utils.data.DataLoader(batches, batch_size=None))
    for gate, start in zip(trained.model.pos.gates, before, strict=True):
        assert not torch.equal(gate.weight, start)
    trainer.save_checkpoint(tmp_path / "fox.ckpt")
    saved = torch.load(tmp_path / "fox.ckpt", map_location="cpu", weights_only=False)
    assert len(saved["optimizer_states"][0]["state"]) == len(list(trained.parameters()))
    restored = module(8)
    restored.load_state_dict(saved["state_dict"])
    for gate, want in zip(restored.model.pos.gates, trained.model.pos.gates, strict=True):
        assert torch.equal(gate.weight, want.weight) and torch.equal(gate.bias, want.bias)


@pytest.mark.parametrize("cls", [ForgettingTransformer, DataDependentALiBi])
def test_refusals(cls):
    assert cls.bias_kind == "content"  # the gates are read from the layer input: no function of positions
    name = cls.config_name()
    for variant in (Local, Linear, Performer):
        reason = variant.refusal(cls)
        assert reason and f"content logit bias (pos={name})" in reason and "\n" not in reason
    assert Softmax.refusal(cls) is None
    with pytest.raises(ConfigError, match="reads no position index"):
        randomized(cls, randomize=True, max_position=64)(Shape(C, H, 1, 8, True))
    with pytest.raises(ConfigError, match=r"^init_std=-1"):  # worded by argument: a library call, not a config
        cls(Shape(C, H, 1, 8, True), init_std=-1.0)


def test_fox_refuses_a_bidirectional_task_and_dd_alibi_takes_it():
    with pytest.raises(IncompatiblePairing, match=r"pos=fox with a bidirectional task: .*j ≤ i.*pos=dd_alibi"):
        ForgettingTransformer(Shape(C, H, 1, 8, causal=False))
    assert DataDependentALiBi(Shape(C, H, 1, 8, causal=False)).gates[0].out_features == 2 * H
