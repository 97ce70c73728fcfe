"""Attention diagnostics: the statistics against hand-computed values, a model whose attention is set by
hand, the files, the report panel, and tiny runs with diagnostics=true for every variant read back from MLflow."""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch
from torch.testing import assert_close

from harness.config.load import load
from harness.errors import ConfigError
from harness.model.diagnostics import as_distribution, attention_diagnostics, attention_stats
from harness.model.transformer import Transformer
from tests.helpers import assert_figure, validated

F64 = torch.float64
HAND_SET = ("softmax", "local", "linear", "performer")  # the variants whose uniform weights are set by hand below


def stats_of(rows: list[list[float]], queries=None):
    return attention_stats(torch.tensor(rows, dtype=F64)[None, None], queries)  # (1, 1, T, T)


# ---------------------------------------------------------------- the statistics, by hand


def test_a_hand_written_pattern():
    """Query 0 looks at itself, query 1 half at itself and half back, query 2 a quarter at each earlier key."""
    s = stats_of([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    assert_close(s.mean_distance, torch.tensor([(0 + 0.5 + (0.25 * 2 + 0.25 * 1)) / 3], dtype=F64))  # 5/12
    assert_close(s.mean_entropy, torch.tensor([(0 + math.log(2) + 1.5 * math.log(2)) / 3], dtype=F64))  # 5/6 ln 2
    # offsets −2 … 2: (0,2) → 0; (0,1), (1,2) → 0; the diagonal (1 + .5 + .5)/3; (1,0), (2,1) (.5 + .25)/2; (2,0) .25
    assert_close(s.offset_profile, torch.tensor([[0.0, 0.0, 2 / 3, 0.375, 0.25]], dtype=F64))
    assert s.queries == 3


@pytest.mark.parametrize("T", [1, 2, 7, 32])
def test_uniform_attention_has_entropy_ln_t_and_distance_t2_minus_1_over_3t(T):
    s = attention_stats(torch.full((2, 3, T, T), 1 / T, dtype=F64))
    assert_close(s.mean_distance, torch.full((3,), (T * T - 1) / (3 * T), dtype=F64), rtol=1e-12, atol=1e-12)
    assert_close(s.mean_entropy, torch.full((3,), math.log(T), dtype=F64), rtol=1e-12, atol=1e-12)
    assert_close(s.offset_profile, torch.full((3, 2 * T - 1), 1 / T, dtype=F64), rtol=1e-12, atol=1e-12)


def test_causal_uniform_attention():
    """w_ij = 1/(i + 1) for j ≤ i: query i's distance is i/2, so the mean is (T − 1)/4; entropy ln(i + 1)."""
    T = 9
    w = torch.tril(torch.ones(T, T, dtype=F64)) / torch.arange(1, T + 1, dtype=F64)[:, None]
    s = attention_stats(w[None, None])
    assert_close(s.mean_distance, torch.tensor([(T - 1) / 4], dtype=F64), rtol=1e-12, atol=1e-12)
    assert_close(s.mean_entropy, torch.tensor([sum(math.log(i + 1) for i in range(T)) / T], dtype=F64))
    profile = [0.0] * (T - 1) + [sum(1 / (i + 1) for i in range(o, T)) / (T - o) for o in range(T)]
    assert_close(s.offset_profile[0], torch.tensor(profile, dtype=F64), rtol=1e-12, atol=1e-12)


def test_previous_token_attention_has_distance_t_minus_1_over_t_and_no_entropy():
    T = 6
    w = torch.zeros(T, T, dtype=F64)
    w[0, 0] = 1.0
    w[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    s = attention_stats(w[None, None])
    assert_close(s.mean_distance, torch.tensor([(T - 1) / T], dtype=F64))
    assert_close(s.mean_entropy, torch.zeros(1, dtype=F64))
    assert_close(s.offset_profile[0, T - 1 : T + 1], torch.tensor([1 / T, 1.0], dtype=F64))  # offsets 0 and 1


def test_padded_queries_and_queries_without_keys_are_not_counted():
    rows = [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]  # query 1 sees no key
    s = stats_of(rows, queries=torch.tensor([[True, True, False]]))  # query 2 is padding
    assert s.queries == 1 and s.mean_distance.item() == 0.0
    assert_close(s.pairs, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=F64))  # query 0's row: offsets −2, −1, 0


def test_stats_add_up_over_batches():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(5, 2, 8, 8, generator=g, dtype=F64), -1)
    whole, parts = attention_stats(w), attention_stats(w[:2]) + attention_stats(w[2:])
    assert_close(vars(whole), vars(parts), rtol=1e-12, atol=1e-12)  # every field, by name


def test_as_distribution():
    w = torch.tensor([[0.2, 0.8, 0.0], [0.6, -0.2, 0.6], [0.0, 0.0, 0.0]], dtype=F64)
    assert_close(as_distribution(w), torch.tensor([[0.2, 0.8, 0.0], [3 / 7, 1 / 7, 3 / 7], [0, 0, 0]], dtype=F64))


# ---------------------------------------------------------------- a model whose attention is set by hand


def uniform_attention_model(attn: str, causal: bool, T: int) -> Transformer:
    """pos=none and q = k = 0: every variant attends uniformly over the keys it may see."""
    spec = load(
        [
            "pos=none",
            f"attn={attn}",
            "model.n_layers=2",
            "model.d_model=16",
            "model.n_heads=2",
            f"data.seq_len={T}",
            *(["attn.window=8"] if attn == "local" else []),
        ]
    )
    torch.manual_seed(0)
    model = Transformer(spec.model, 258, T, causal, pos=spec.pos.factory(), attn=spec.attn.factory())
    with torch.no_grad():
        for block in model.blocks:
            C = block.attn.out.in_features
            block.attn.qkv.weight[: 2 * C].zero_()  # rows of q and k (qkv splits as q, k, v)
            block.attn.qkv.bias[: 2 * C].zero_()
    return model.double()


def seen_keys(attn: str, causal: bool, T: int, i: int) -> range:
    if attn == "local":  # window 8: |i − j| ≤ 4 bidirectional, the last 8 keys causal
        return range(max(0, i - 7), i + 1) if causal else range(max(0, i - 4), min(T, i + 5))
    return range(i + 1) if causal else range(T)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attn", HAND_SET)
def test_a_model_with_hand_set_uniform_attention_has_the_distance_it_should(attn, causal):
    T = 32
    model = uniform_attention_model(attn, causal, T)
    g = torch.Generator().manual_seed(1)
    batches = [
        {
            "input_ids": torch.randint(0, 256, (4, T), generator=g),
            "key_padding_mask": torch.ones(4, T, dtype=torch.bool),
        }
        for _ in range(2)
    ]
    diag = attention_diagnostics(model, batches, windows=6)
    keys = [seen_keys(attn, causal, T, i) for i in range(T)]
    distance = sum(sum(abs(i - j) for j in js) / len(js) for i, js in enumerate(keys)) / T
    entropy = sum(math.log(len(js)) for js in keys) / T
    metrics = diag.metrics()
    assert metrics["diag/mean_distance"] == pytest.approx(distance, rel=1e-10)
    assert metrics["diag/entropy"] == pytest.approx(entropy, rel=1e-10)
    assert metrics["diag/weights_error"] < 1e-10  # w @ v is what each layer's variant returned
    assert [int(s.queries) for s in diag.layers] == [6 * T, 6 * T]  # 6 windows of the 8 offered
    assert not diag.signed and model.training  # the model is handed back in the mode it came in


def test_files_hold_the_figures_and_the_numbers():
    model = uniform_attention_model("softmax", False, 16)
    diag = attention_diagnostics(
        model,
        [{"input_ids": torch.zeros(2, 16, dtype=torch.long), "key_padding_mask": torch.ones(2, 16, dtype=torch.bool)}],
    )
    files = diag.files()
    figures = ["attention_distance.png", "attention_entropy.png", "attention_by_offset.png", "attention_maps.png"]
    assert sorted(files) == sorted(["attention_stats.csv", "attention_by_offset.csv", *figures])
    for name in figures:
        assert_figure(files[name])
    rows = list(csv.DictReader(io.StringIO(files["attention_stats.csv"])))
    assert [(r["layer"], r["head"]) for r in rows] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert float(rows[0]["mean_distance"]) == pytest.approx((16 * 16 - 1) / (3 * 16), rel=1e-5)
    offsets = list(csv.DictReader(io.StringIO(files["attention_by_offset.csv"])))
    assert len(offsets) == 2 * 2 * 31 and all(float(r["mean_weight"]) == pytest.approx(1 / 16) for r in offsets)


# ---------------------------------------------------------------- config


def checked(overrides, store):
    return validated(*overrides).spec


def test_diagnostics_is_a_checked_switch_refused_for_a_variant_without_weights(store, monkeypatch):
    assert checked([], store).run.diagnostics is False
    assert checked(["diagnostics=true"], store).run.diagnostics is True
    with pytest.raises(ConfigError, match="diagnostics='yes' must be true or false"):
        checked(["diagnostics=yes"], store)
    from attention.local import Local

    monkeypatch.setattr(Local, "implies_weights", classmethod(lambda cls: False))
    with pytest.raises(ConfigError, match="diagnostics=true needs the attention weights, which attn=local does not"):
        checked(["diagnostics=true", "attn=local"], store)


# ---------------------------------------------------------------- the sweep report's panel


def test_report_compares_mean_attention_distance_across_schemes(tmp_path):
    from results.cells import Cell, build_report
    from results.report import write_report

    def cell(pos, attn, seed, distance):
        return Cell(
            f"{pos}{attn}{seed}",
            "n",
            f"pos={pos} attn={attn} seed={seed}",
            pos,
            attn,
            str(seed),
            "finished",
            val=[(10, 3.0)],
            job=seed,
            metrics={"diag/mean_distance": distance, "diag/entropy": distance / 10},
        )

    cells = [
        cell("rope", "softmax", 0, 4.0),
        cell("rope", "softmax", 1, 6.0),
        cell("none", "softmax", 0, 9.0),
        cell("rope", "local", 0, 2.0),
        Cell("x", "n", "pos=alibi", "alibi", "softmax", "0", "finished", val=[(10, 3.0)]),
    ]  # no diagnostics: left out of the panel
    written = write_report(build_report(cells, "t", []), tmp_path)
    assert tmp_path / "attention_distance.png" in written
    md = (tmp_path / "report.md").read_text()
    assert "## Attention (diagnostics=true)" in md
    assert "| rope | softmax | 5.00 ± 1.41 | 0.500 ± 0.141 |" in md and "| rope | local | 2.00 | 0.200 |" in md
    rows = {(r["pos"], r["attn"]): r for r in csv.DictReader((tmp_path / "report.csv").open())}
    assert (
        float(rows["none", "softmax"]["attn_distance_mean"]) == 9.0
        and rows["alibi", "softmax"]["attn_distance_mean"] == ""
    )
