"""Length extrapolation: sliding windows, loss by position, same targets, eval-time scalings and
fine-tuning on one trained model (harness/model/extrapolation.py, harness/model/evaluate.py)."""

from __future__ import annotations

import csv
import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attention.softmax import Softmax
from harness.data.objectives import CausalLM
from harness.data.tokenizer import ByteTokenizer
from harness.data.windows import IGNORE, EvalWindows, window_starts
from harness.errors import ConfigError
from harness.model.evaluate import WindowScores, evaluate_lengths, score_windows
from harness.model.extrapolation import bucket_losses, evaluate_extrapolation
from harness.model.module import LanguageModel
from harness.model.transformer import ModelConfig, Transformer
from positional.alibi import ALiBi
from positional.learned import Learned
from positional.rope import Rope
from tests.helpers import assert_figure, rope_args

TEXT = bytes(range(32, 127)) * 8 + b"the quick brown fox jumps over the lazy dog. " * 20  # 1,660 bytes


def tiny_module(pos=Rope, max_len: int = 16) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
    model = Transformer(cfg, vocab_size=258, max_len=max_len, causal=True, pos=pos, attn=Softmax).double()
    return LanguageModel(model, optimizer=None, schedule=None, bytes_per_token=1.0).eval()


def data(eval_batches=None, batch_size=4, seq_len=16):
    return SimpleNamespace(batch_size=batch_size, seq_len=seq_len, eval_batches=eval_batches)


CORPUS = SimpleNamespace(val=TEXT, train=TEXT * 4)
TOK = ByteTokenizer()


def test_window_starts_advance_by_stride_until_one_reaches_the_end():
    assert window_starts(10, 4, 4) == [0, 4, 8]  # non-overlapping: range(0, 10, 4)
    assert window_starts(10, 4, 2) == [0, 2, 4, 6]  # 6 + 4 = 10 reaches the last label
    assert window_starts(3, 4, 1) == [0]
    for n, length in [(1, 1), (17, 5), (64, 8), (65, 8)]:
        assert window_starts(n, length, length) == list(range(0, n, length))


def test_sliding_windows_score_every_token_once():
    ids = TOK.encode(TEXT[:103])  # 102 labels
    windows = EvalWindows.sliding(ids, 17, 5, CausalLM(TOK), TOK.pad_id)  # 16 labels, stride 5
    scored = []
    for k, start in enumerate(windows.starts):
        labels = windows[k]["labels"]
        scored += [start + j for j in range(16) if labels[j] != IGNORE]
    assert scored == list(range(102))


def test_stride_equal_to_length_is_the_non_overlapping_number_exactly():
    module, objective = tiny_module(), CausalLM(TOK)
    ids = TOK.encode(TEXT)
    plain = score_windows(module, EvalWindows(ids, 17, objective, TOK.pad_id), 8)
    sliding = score_windows(module, EvalWindows.sliding(ids, 17, 16, objective, TOK.pad_id), 8)
    assert torch.equal(plain.loss_sum, sliding.loss_sum) and torch.equal(plain.count, sliding.count)
    results = evaluate_lengths(module, CORPUS, TOK, objective, data(eval_batches=2), [16, 32], stride=16)
    assert results.sliding[16] == results.losses[16]
    assert results.sliding[32] != results.losses[32]  # stride 16 < 32: more context for most tokens


def reference_sliding_loss(model, ids: np.ndarray, length: int, stride: int) -> float:
    """Each label p is predicted once, by the first window [s, s + length) that holds it, s a multiple of the
    stride: with a causal model that is the last logit of the prefix ids[s : p + 1] (float64, token by token)."""
    total, n_labels = 0.0, len(ids) - 1
    for p in range(n_labels):
        s = 0 if p < length else math.ceil((p - length + 1) / stride) * stride
        logits = model(torch.from_numpy(ids[s : p + 1].astype(np.int64))[None])  # (1, p + 1 - s, V)
        total -= float(torch.log_softmax(logits[0, -1].double(), -1)[int(ids[p + 1])])
    return total / n_labels


def test_sliding_window_loss_equals_a_token_by_token_float64_reference():
    module, ids = tiny_module(), TOK.encode(TEXT[:61])  # 60 labels, not a multiple of the stride
    windows = EvalWindows.sliding(ids, 17, 6, CausalLM(TOK), TOK.pad_id)
    got = score_windows(module, windows, 3).loss
    with torch.no_grad():
        want = reference_sliding_loss(module.model, ids, 16, 6)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_loss_by_position_buckets_average_to_the_window_loss():
    module = tiny_module()
    scores = score_windows(module, EvalWindows(TOK.encode(TEXT), 33, CausalLM(TOK), TOK.pad_id), 4)
    for n_buckets in (1, 5, 8, 32, 100):
        buckets = bucket_losses(scores, n_buckets)
        assert [b.start for b in buckets][0] == 0 and buckets[-1].end == 32
        assert all(a.end == b.start for a, b in zip(buckets[:-1], buckets[1:], strict=True))
        mean = sum(b.loss * b.tokens for b in buckets) / sum(b.tokens for b in buckets)
        assert mean == pytest.approx(scores.loss, rel=1e-12)
    synthetic = WindowScores(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), torch.tensor([1.0, 1, 2, 0]))
    assert [(b.start, b.end, b.tokens, b.loss) for b in bucket_losses(synthetic, 2)] == [(0, 2, 2, 1.5), (2, 4, 2, 3.5)]


def test_same_targets_score_the_same_tokens_at_every_length():
    ids, objective = TOK.encode(TEXT), CausalLM(TOK)
    ends = [64, 128, 192]
    targets = {}
    for length in (8, 16, 64):
        windows = EvalWindows.last_tokens(ids, length + 1, ends, 8, objective, TOK.pad_id)
        targets[length] = [
            [
                (windows.starts[k] + j, int(windows[k]["labels"][j]))
                for j in range(length)
                if windows[k]["labels"][j] != IGNORE
            ]
            for k in range(len(ends))
        ]
    assert targets[8] == targets[16] == targets[64]
    assert [len(t) for t in targets[64]] == [8, 8, 8] and targets[64][0][0][0] == 56


def test_a_run_scores_the_same_targets_at_every_length(monkeypatch):
    from harness.config.spec import EvalSettings

    seen = {}
    last_tokens = EvalWindows.last_tokens

    def recorded(ids, tokens, ends, keep, *rest, **kw):
        seen[tokens] = list(ends)
        return last_tokens(ids, tokens, ends, keep, *rest, **kw)

    monkeypatch.setattr(EvalWindows, "last_tokens", staticmethod(recorded))
    settings = EvalSettings(lengths=[8, 16, 64], same_targets=4)
    evaluate_extrapolation(tiny_module(), CORPUS, TOK, CausalLM(TOK), data(eval_batches=2), settings, seed=0)
    assert sorted(seen) == [9, 17, 65] and seen[9] == seen[17] == seen[65] and seen[65][0] == 64


def test_rescaled_swaps_the_scaling_and_restores_it():
    module = tiny_module(pos=Rope, max_len=16)
    pos = module.model.pos
    assert pos.scaling.method == "none"
    with pos.rescaled("yarn", 64) as scaling:
        assert (scaling.method, scaling.factor, pos.scaling.method) == ("yarn", 4.0, "yarn")
    assert (pos.scaling.method, pos.scaling.factor) == ("none", 1.0)
    with pos.rescaled("dynamic_ntk", 64) as scaling:  # reads s from the length: no factor
        assert scaling.factor == 1.0
    with pos.rescaled("linear", 8) as scaling:  # below the training length: s = 1
        assert scaling.factor == 1.0
    with pytest.raises(RuntimeError), pos.rescaled("linear", 64):
        raise RuntimeError("restored on the way out too")
    assert pos.scaling.method == "none"
    fixed = Rope(module.model.pos.shape, **rope_args(scaling="linear", factor=4.0))  # a factor: s = 4 at every length
    with fixed.rescaled("ntk", 128) as scaling:
        assert (scaling.method, scaling.factor) == ("ntk", 4.0)
    assert (fixed.scaling.method, fixed.scaling.factor) == ("linear", 4.0)


def test_rescaled_in_training_applies_the_scaling_to_training_forwards():
    module = tiny_module()
    x = torch.randint(256, (2, 32))
    module.model.train()
    plain = module.model(x)
    with module.model.pos.rescaled("linear", 32, in_training=True):
        tuned = module.model(x)
    with module.model.pos.rescaled("linear", 32):
        untouched = module.model(x)  # training mode, eval-only scaling: plain angles
    assert not torch.allclose(plain, tuned) and torch.equal(plain, untouched)


def test_a_scheme_without_length_scaling_refuses_with_a_reason():
    pos = tiny_module(pos=ALiBi).model.pos
    assert pos.length_scalings == ()
    with pytest.raises(ConfigError, match="pos=alibi has none"), pos.rescaled("yarn", 64):
        pass


def test_scaling_none_equals_the_configured_plain_number_and_finetune_restores_the_weights():
    module = tiny_module()
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    from harness.config.spec import EvalSettings

    settings = EvalSettings(
        lengths=[16, 64],
        stride=8,
        same_targets=4,
        scalings=["none", "linear", "yarn"],
        finetune_steps=2,
        finetune_length=32,
        finetune_lr=1e-3,
    )
    out = evaluate_extrapolation(module, CORPUS, TOK, CausalLM(TOK), data(eval_batches=2), settings, seed=0)
    metrics = out.metrics(bytes_per_token=1.0)
    for key in ("loss_at_16", "loss_at_64", "loss_at_64_stride_8", "loss_at_64_last_4"):
        assert metrics[f"val/none/{key}"] == metrics[f"val/{key}"]
    assert metrics["val/linear/loss_at_16"] == metrics["val/loss_at_16"]  # s = 1 at the training length
    assert metrics["val/linear/loss_at_64"] != metrics["val/loss_at_64"]
    assert len(out.finetune_losses["yarn"]) == 2 and "val/finetuned/yarn/loss_at_64_stride_8" in metrics
    assert metrics["val/finetuned/none/loss_at_16"] != metrics["val/loss_at_16"]  # the fine-tune changed it
    after = module.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    files = out.files(4)
    rows = list(csv.DictReader(io.StringIO(files["loss_by_position.csv"].decode())))
    assert {r["condition"] for r in rows} == {
        "configured",
        "none",
        "linear",
        "yarn",
        "finetuned/none",
        "finetuned/linear",
        "finetuned/yarn",
    }
    assert_figure(files["loss_by_position.png"])
    assert_figure(files["loss_vs_length_by_scaling.png"])


def test_every_length_beyond_the_schemes_range_is_skipped_and_its_files_still_written():
    """pos=learned has no row past its training length: each length is skipped with its reason, and the files
    are the CSV's header, with no picture of nothing."""
    from harness.config.spec import EvalSettings

    out = evaluate_extrapolation(
        tiny_module(Learned), CORPUS, TOK, CausalLM(TOK), data(eval_batches=2), EvalSettings(lengths=[32]), seed=0
    )
    assert list(out.skipped) == [32] and out.metrics(bytes_per_token=1.0) == {}
    files = out.files(4)
    assert files == {"loss_by_position.csv": b"condition,length,start,end,tokens,loss\n"}


def test_a_run_logs_every_condition_and_its_artifacts_to_mlflow(train_tiny):
    summary, client = train_tiny(
        "task=clm",
        "eval.lengths=[32,64]",
        "eval.stride=16",
        "eval.same_targets=8",
        "eval.scalings=[none,ntk]",
        "eval.finetune_steps=1",
        "checkpoint.every_n_steps=0",
    )
    run = client.get_run(summary.run_id)
    metrics = run.data.metrics
    for prefix in ("", "none/", "ntk/", "finetuned/none/", "finetuned/ntk/"):
        for key in ("loss_at_32", "loss_at_64", "loss_at_64_stride_16", "loss_at_32_last_8"):
            assert math.isfinite(metrics[f"val/{prefix}{key}"]), prefix + key
    assert metrics["val/none/loss_at_64"] == metrics["val/loss_at_64"]
    assert metrics["val/loss_at_32_stride_16"] != metrics["val/loss_at_32"]
    names = {a.path for a in client.list_artifacts(summary.run_id)}
    assert {"loss_by_position.csv", "loss_by_position.png", "loss_vs_length_by_scaling.png"} <= names
