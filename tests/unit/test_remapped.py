"""Self-Extend and Dual Chunk Attention (harness/pretrained/remapped.py) against their papers' definitions, in
float64: each pair's logit from q and k rotated at the positions Jin et al. 2024 (§3) and An et al. 2024 (§3, with
the authors' constants) give that pair, computed here pair by pair; and their limits: group size 1, a window or a
chunk past the sequence is the model's own attention."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from harness.errors import ConfigError
from harness.pretrained.remapped import NAME, apply_remapped, remapped_attention
from harness.pretrained.rotary import apply_scaling, rotary_modules
from positional.rope_remapped import DualChunk, SelfExtend
from tests.helpers import gemma3

F64 = torch.float64


def tiny_llama(theta: float = 10000.0, family: str = "Llama", **more):
    """A 2-layer ``family`` model (Llama; Mistral, Qwen2 with ``more``'s sliding window) in float64."""
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        **more,
    )
    return getattr(transformers, f"{family}ForCausalLM")(config).to(F64).eval()


def rotated(x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """x (…, D) rotated at ``positions`` (…,) in transformers' doubled form, from scratch."""
    angles = positions[..., None].to(F64) * theta
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def self_extend_at(i: int, j: int, group: int, window: int) -> tuple[int, int]:
    """Jin et al. 2024: for i − j < W, q at i and k at j; else q at ⌊i/G⌋ + W − ⌊W/G⌋ and k at ⌊j/G⌋."""
    return (i, j) if i - j < window else (i // group + window - window // group, j // group)


def dca_at(i: int, j: int, chunk: int, local: int) -> tuple[int, int]:
    """An et al. 2024: k at j mod s; q at i mod s within its chunk, at min(i mod s + s, s + w) against the chunk
    before, at min(2s − 1, s + w) against older ones."""
    apart = i // chunk - j // chunk
    if apart == 0:
        return i % chunk, j % chunk
    return (min(i % chunk + chunk, chunk + local) if apart == 1 else min(2 * chunk - 1, chunk + local)), j % chunk


def reference(q, k, v, at, theta: torch.Tensor, scaling: float) -> torch.Tensor:
    """The attention output (B, T, H, D) pair by pair, q and k rotated at ``at(i, j)``; one softmax."""
    batch, heads, length, _ = q.shape
    scores = torch.full((batch, heads, length, length), -math.inf, dtype=F64)
    for i in range(length):
        for j in range(i + 1):
            pq, pk = (torch.tensor(p) for p in at(i, j))
            scores[..., i, j] = (rotated(q[..., i, :], pq, theta) * rotated(k[..., j, :], pk, theta)).sum(-1) * scaling
    return torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2)


@pytest.mark.parametrize(
    "remap",
    [
        SelfExtend(2, 4),
        SelfExtend(3, 5),
        SelfExtend(4, 8),
        SelfExtend(1, 4),
        SelfExtend(4, 32),
        DualChunk(5, 2),
        DualChunk(6, 1),
        DualChunk(4, 4),
        DualChunk(32, 2),
    ],
    ids=lambda r: r.name(),
)
def test_remapped_attention_is_its_papers_definition_pair_by_pair(remap):
    """Random q, k, v as a head sees them (rotated at 0 … T − 1 by the model's RoPE before the attention function),
    against each pair computed from the unrotated q and k at the paper's positions."""
    model = tiny_llama()
    apply_remapped(model, remap)
    length, theta = 20, 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, length, 16, dtype=F64) for _ in range(3))
    position = torch.arange(length)
    attention = next(m for m in model.modules() if hasattr(m, "posbench_remap"))
    attention.num_key_value_groups = 1  # these q, k, v have a head each
    got, _ = remapped_attention(attention, rotated(q, position, theta), rotated(k, position, theta), v, None, 0.25)
    if isinstance(remap, SelfExtend):
        at = lambda i, j: self_extend_at(i, j, remap.group, remap.window)  # noqa: E731
    else:
        at = lambda i, j: dca_at(i, j, remap.chunk, remap.local)  # noqa: E731
    torch.testing.assert_close(got, reference(q, k, v, at, theta, 0.25), rtol=0, atol=1e-12)


@pytest.mark.parametrize("modifier", ["resonance", "hope"])
def test_remapped_positions_turn_with_the_theta_that_rotated_q_and_k(modifier):
    """self_extend+resonance, self_extend+hope: posbench's rotary turned q and k with the modified θ, so the remap turns
    them on with that θ, not the model's plain one (rotations compose only for one θ)."""
    model, remap = tiny_llama(), SelfExtend(2, 4)
    [scaling] = apply_scaling(model, **{modifier: True}).values()
    apply_remapped(model, remap)
    [(parent, name)] = rotary_modules(model)
    theta = getattr(parent, name).theta(scaling)
    assert not torch.equal(theta, 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16))  # the modifier changed θ
    length = 20
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, length, 16, dtype=F64) for _ in range(3))
    position = torch.arange(length)
    attention = next(m for m in model.modules() if hasattr(m, "posbench_remap"))
    attention.num_key_value_groups = 1
    got, _ = remapped_attention(attention, rotated(q, position, theta), rotated(k, position, theta), v, None, 0.25)
    at = lambda i, j: self_extend_at(i, j, remap.group, remap.window)  # noqa: E731
    torch.testing.assert_close(got, reference(q, k, v, at, theta, 0.25), rtol=0, atol=1e-12)


def logits(model, length: int = 24) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=(torch.arange(length)[None] * 7) % 97).logits


@pytest.mark.parametrize("remap", [SelfExtend(4, 8), DualChunk(11, 2)], ids=lambda r: r.name())
def test_decoding_with_a_cache_gives_a_full_forwards_logits(remap):
    """generate(use_cache=True), as lm-eval's generate_until runs it: after the prompt, each step's one query is the
    last position against every cached key, remapped as in a forward over the whole sequence (the authors' patches
    serve q_len = 1 the same way)."""
    model = tiny_llama()
    apply_remapped(model, remap)
    ids = (torch.arange(40)[None] * 7) % 97
    with torch.no_grad():
        prefix = model(input_ids=ids[:, :-2], use_cache=True).past_key_values
        steps = [model(input_ids=ids[:, t : t + 1], past_key_values=prefix, use_cache=True).logits for t in (38, 39)]
        full = model(input_ids=ids).logits
    torch.testing.assert_close(torch.cat(steps, 1), full[:, -2:], rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "family",
    [
        {},
        {"family": "Mistral", "sliding_window": 6},  # every layer slides
        {"family": "Qwen2", "sliding_window": 6, "use_sliding_window": True, "max_window_layers": 1},  # the second
        {"family": "Gemma2", "sliding_window": 6, "head_dim": 16, "attn_logit_softcapping": 0.1},  # its logits capped
    ],
    ids=lambda f: f.get("family", "Llama"),
)
def test_group_one_or_a_window_or_chunk_past_the_sequence_is_the_models_own_attention(family):
    """The model's own attention includes its sliding window, where its layers slide, and Gemma 2's cap on the
    attention logits."""
    own = tiny_llama(**family)
    plain = logits(own)
    close = 1e-7 if "attn_logit_softcapping" in family else 1e-12  # Gemma 2's own softmax runs in fp32
    for remap in (SelfExtend(1, 4), SelfExtend(4, 24), DualChunk(24, 3)):
        model = tiny_llama(**family)
        apply_remapped(model, remap)
        torch.testing.assert_close(logits(model), plain, rtol=0, atol=close)
    for remap in (SelfExtend(4, 4), DualChunk(4, 2)):  # pairs remapped within the sliding window too
        model = tiny_llama(**family)
        apply_remapped(model, remap)
        assert (logits(model) - plain).abs().max() > 1e-4  # remapped positions beyond the window change the logits
    model.set_attn_implementation(own.config._attn_implementation)  # hf-eval puts the model's own back after a cell
    torch.testing.assert_close(logits(model), plain, rtol=0, atol=close)


def test_it_stacks_on_posbenchs_rotary_and_refuses_what_it_cannot_rotate(tmp_path):
    model, plain = tiny_llama(), tiny_llama()
    apply_scaling(model)  # the model's own RoPE through posbench's rotary (fp64 angles), as hf-eval's cells run it
    apply_scaling(plain)
    apply_remapped(model, SelfExtend(1, 4))
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
        apply_remapped(neox, SelfExtend(2, 4))
    gemma = transformers.Gemma3ForCausalLM(gemma3())  # θ = 10k on sliding layers, 1M on the full one
    apply_scaling(gemma)  # as hf-eval's cell swaps the rotary in first
    with pytest.raises(ConfigError, match=r"by one θ .* by a θ per layer type \(sliding_attention, full_attention\)"):
        apply_remapped(gemma, SelfExtend(2, 4))
    from harness.pretrained.hf_eval import parse

    (tmp_path / "config.json").write_text(json.dumps(gemma3().to_dict()))  # hf-eval --check says it from the config
    with pytest.raises(ConfigError, match=r"dca re-rotates whole heads by one θ; .* a θ per layer type"):
        parse(
            [str(tmp_path), "--scalings", "none,dca", "--lengths", "32", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]
        )


def test_hf_eval_measures_self_extend_and_dca_with_their_settings_in_the_cell_names(tmp_path, store):
    """`--scalings self_extend,dca,none --factors 4`: Self-Extend's group size is the factor, its window half the
    trained context (64 → 32) unless --window says; DCA runs once, chunk 11L/16 = 44 and local window L/16 = 4; each
    cell named with its settings, read back from MLflow; the next cell runs the model's own attention again."""
    from mlflow.tracking import MlflowClient

    from harness.pretrained.hf_eval import main, parse
    from tests.helpers import tiny_llama as saved_llama

    folder, uri = saved_llama(tmp_path / "m"), store  # store: a copy of the migrated empty store
    argv = [str(folder), "--scalings", "self_extend,dca,none", "--factors", "4", "--lengths", "32,128"]
    assert main([*argv, "--budget", "128", "--key-short", "0", "--passkey-trials", "0", "--tracking-uri", uri]) == 0
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("hf-eval").experiment_id])
    at = {r.info.run_name: r.data.metrics["val/loss_at_32"] for r in runs if "val/loss_at_128" in r.data.metrics}
    assert set(at) == {"self_extend group 4 window 32", "dca chunk 44 local 4", "none x1"}
    assert at["self_extend group 4 window 32"] == pytest.approx(at["none x1"], rel=1e-6)  # within the window
    assert at["dca chunk 44 local 4"] == pytest.approx(at["none x1"], rel=1e-6)  # within one chunk
    with pytest.raises(ConfigError, match="self_extend's factor is its group size, a whole number"):
        parse([*argv[:-4], "--factors", "2.5", "--lengths", "32"])
    with pytest.raises(ConfigError, match="self_extend's factor is its group size, a whole number"):
        parse([str(folder), "--scalings", "self_extend+hope", "--factors", "2.5", "--lengths", "32"])  # a modifier too
    with pytest.raises(ConfigError, match="--window=0: Self-Extend's neighbour window is a positive number"):
        parse([*argv, "--window", "0"])  # the one size a user gives: apply_remapped's are ≥ 1 from here on
