"""Self-Extend (harness/pretrained/self_extend.py) against its paper's definition, in float64: each pair's logit
from q and k rotated at the positions Jin et al. 2024 (§3, Eq. 4–5) give that pair, computed here directly; and
its limits: group size 1 or a window past the sequence is the model's own attention."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from harness.errors import ConfigError
from harness.pretrained.rotary import apply_scaling
from harness.pretrained.self_extend import NAME, apply_self_extend, restore, self_extend_attention

F64 = torch.float64


def tiny_llama(theta: float = 10000.0):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    return transformers.LlamaForCausalLM(config).to(F64).eval()


def rotated(x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """x (…, D) rotated at ``positions`` (…,) in transformers' doubled form, from scratch."""
    angles = positions[..., None].to(F64) * theta
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def reference(q, k, v, group: int, window: int, theta: torch.Tensor, scaling: float) -> torch.Tensor:
    """Self-Extend's attention output (B, T, H, D) pair by pair: for i − j < W, q at i and k at j; else q at
    ⌊i/G⌋ + W − ⌊W/G⌋ and k at ⌊j/G⌋ (the paper's grouped positions); one softmax over the merged logits."""
    batch, heads, length, _ = q.shape
    scores = torch.full((batch, heads, length, length), -math.inf, dtype=F64)
    for i in range(length):
        for j in range(i + 1):
            near = i - j < window
            pq = torch.tensor(i if near else i // group + window - window // group)
            pk = torch.tensor(j if near else j // group)
            scores[..., i, j] = (rotated(q[..., i, :], pq, theta) * rotated(k[..., j, :], pk, theta)).sum(-1) * scaling
    return torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2)


@pytest.mark.parametrize(("group", "window"), [(2, 4), (3, 5), (4, 8), (1, 4), (4, 32)])
def test_self_extend_is_its_papers_definition_pair_by_pair(group, window):
    """Random q, k, v as a head sees them (rotated at 0 … T − 1 by the model's RoPE before the attention function),
    against each pair computed from the unrotated q and k at the paper's positions."""
    model = tiny_llama()
    extend = apply_self_extend(model, group, window)
    length, theta = 20, 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, length, 16, dtype=F64) for _ in range(3))
    position = torch.arange(length)
    attention = next(m for m in model.modules() if hasattr(m, "posbench_self_extend"))
    attention.num_key_value_groups = 1  # these q, k, v have a head each
    got, _ = self_extend_attention(attention, rotated(q, position, theta), rotated(k, position, theta), v, None, 0.25)
    torch.testing.assert_close(got, reference(q, k, v, group, window, theta, 0.25), rtol=0, atol=1e-12)
    assert extend.positions(length)[0].max() == (length - 1) // group + window - window // group


def logits(model, length: int = 24) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=(torch.arange(length)[None] * 7) % 97).logits


def test_group_one_or_a_window_past_the_sequence_is_the_models_own_attention():
    plain = logits(tiny_llama())
    for group, window in ((1, 4), (4, 24)):
        model = tiny_llama()
        apply_self_extend(model, group, window)
        torch.testing.assert_close(logits(model), plain, rtol=0, atol=1e-12)
    model = tiny_llama()
    apply_self_extend(model, 4, 8)
    assert (logits(model) - plain).abs().max() > 1e-4  # grouped positions beyond the window change the logits
    restore(model, "sdpa")  # the tiny model's own
    torch.testing.assert_close(logits(model), plain, rtol=0, atol=1e-12)


def test_it_stacks_on_posbenchs_rotary_and_refuses_what_it_cannot_rotate():
    model, plain = tiny_llama(), tiny_llama()
    apply_scaling(model)  # the model's own RoPE through posbench's rotary (fp64 angles), as hf-eval's cells run it
    apply_scaling(plain)
    apply_self_extend(model, 1, 4)
    assert model.config._attn_implementation == NAME
    torch.testing.assert_close(logits(model), logits(plain), rtol=0, atol=1e-12)
    neox = transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=50,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
        )
    )
    with pytest.raises(ConfigError, match="rotates 4 of 16 dimensions in its doubled form"):
        apply_self_extend(neox, 2, 4)
    with pytest.raises(ConfigError, match="a group size ≥ 1 and a window ≥ 1, not 0 and 4"):
        apply_self_extend(tiny_llama(), 0, 4)


def test_hf_eval_measures_self_extend_with_its_settings_in_the_cell_name(tmp_path):
    """`--scalings self_extend --factors 4`: the group size is the factor, the window half the trained context
    (64 → 32) unless --window says; the cell is named and tagged with both, read back from MLflow, and the next
    cell runs the model's own attention again."""
    from mlflow.tracking import MlflowClient

    from harness.pretrained.hf_eval import main, parse
    from tests.helpers import tiny_llama as saved_llama

    folder, uri = saved_llama(tmp_path / "m"), f"sqlite:///{tmp_path / 'm.db'}"
    argv = [str(folder), "--scalings", "self_extend,none", "--factors", "4", "--lengths", "32,128", "--budget", "128"]
    assert main([*argv, "--key-short", "0", "--passkey-trials", "0", "--tracking-uri", uri]) == 0
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("hf-eval").experiment_id])
    cells = {r.info.run_name: r for r in runs if "val/loss_at_128" in r.data.metrics}
    assert set(cells) == {"self_extend x4 window 32", "none x1"}
    assert cells["self_extend x4 window 32"].data.tags["window"] == "32"
    at = {name: r.data.metrics["val/loss_at_32"] for name, r in cells.items()}
    assert at["self_extend x4 window 32"] == pytest.approx(at["none x1"], rel=1e-6)  # within the window: the same
    with pytest.raises(ConfigError, match="self_extend's factor is its group size, a whole number"):
        parse([*argv[:-4], "--factors", "2.5", "--lengths", "32"])
