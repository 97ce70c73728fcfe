"""``posbench hf-eval`` (issue 47, item 1): a pretrained causal LM under each RoPE scaling × factor, measured as the
PI / NTK / YaRN papers did — perplexity by length with sliding windows, passkey retrieval by depth × length — one
MLflow run per cell under a parent. The whole loop runs offline on a model posbench trained and exported itself."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harness.errors import ConfigError
from harness.pretrained.evaluate import EvalSpec, check, loss_by_length, parse, passkey_retrieved

pytest.importorskip("transformers")


class Counting(torch.nn.Module):
    """A 'model' whose next-token distribution is uniform over V ids except that it puts probability p on the
    token equal to the current one + 1 (mod V): its loss on any text is known in closed form."""

    def __init__(self, vocab: int = 7, p: float = 0.5):
        super().__init__()
        self.vocab, self.p = vocab, p

    def forward(self, input_ids):
        probs = torch.full((*input_ids.shape, self.vocab), (1 - self.p) / (self.vocab - 1), dtype=torch.float64)
        probs.scatter_(-1, ((input_ids + 1) % self.vocab)[..., None], self.p)
        return type("Out", (), {"logits": probs.log()})


def test_sliding_windows_score_every_label_once_and_match_the_closed_form():
    ids = torch.tensor([(3 * i * i + i) % 7 for i in range(300)])
    model = Counting()
    hits = sum(int(ids[t + 1] == (ids[t] + 1) % 7) for t in range(200))
    expected = -(hits * math.log(0.5) + (200 - hits) * math.log(0.5 / 6)) / 200
    for length, stride in ((16, 8), (50, 50), (64, 1), (200, 100)):
        assert loss_by_length(model, ids, length, stride, budget=200) == pytest.approx(expected, abs=1e-12)


def test_passkey_is_retrieved_exactly_when_greedy_decoding_gives_the_key():
    """A model whose argmax at the answer's positions is the key's digits retrieves it; one digit off, it does not;
    a length the needle and question do not fit gives no figure."""
    encode = lambda text: list(text.encode())  # noqa: E731

    class Oracle(torch.nn.Module):
        def __init__(self, answer: list[int]):
            super().__init__()
            self.answer = answer

        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, 256)
            t = input_ids.shape[1]
            for i, tok in enumerate(self.answer):  # the positions that predict the answer's tokens
                logits[0, t - len(self.answer) + i, tok] = 1.0
            return type("Out", (), {"logits": logits})

    filler = encode("lorem ipsum " * 40)
    assert passkey_retrieved(Oracle(encode("12345")), encode, filler, 200, 0.5, 12345) is True
    assert passkey_retrieved(Oracle(encode("12346")), encode, filler, 200, 0.5, 12345) is False
    assert passkey_retrieved(Oracle(encode("12345")), encode, filler, 40, 0.5, 12345) is None  # does not fit


@pytest.mark.parametrize("argv, needle", [
    (["--scalings", "none,foo"], "--scalings=none,foo: foo unknown"),
    (["--factors", "0.5"], "--factors=0.5: scaling factors are finite and ≥ 1"),
    (["--lengths", "1"], "--lengths=1: give context lengths of at least 2 tokens"),
    (["--lengths", "a,b"], "--lengths=a,b: give comma-separated integers"),
    (["--depths", "1.5"], "--depths=1.5: depths lie in [0, 1]"),
    (["--stride", "999"], "--stride=999 must lie in 1 … the shortest length"),
    (["--budget", "10"], "--budget=10 must cover the longest length"),
])
def test_a_bad_option_is_one_line_naming_the_fix(tmp_path, argv, needle):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[").replace("+", r"\+")):
        parse([str(tmp_path), *argv])


def test_a_hub_name_is_refused_at_once_without_network():
    with pytest.raises(ConfigError, match="a Hub name\\? nothing is downloaded"):
        check(EvalSpec(Path("HuggingFaceTB/SmolLM-135M")))


def test_the_cells_are_the_model_as_trained_then_each_scaling_at_each_factor():
    spec = EvalSpec(Path("."), scalings=("none", "linear", "yarn"), factors=(2.0, 4.0))
    assert spec.cells() == [("none", 1.0), ("linear", 2.0), ("linear", 4.0), ("yarn", 2.0), ("yarn", 4.0)]


@pytest.mark.slow
def test_train_export_extend_evaluate_offline_read_back_from_mlflow(train_tiny, store, capsys, monkeypatch):
    """Train a tiny modern-block RoPE model, export it (export=hf), then `posbench hf-eval` its folder under none,
    linear and YaRN at 2×: a parent run with a child per cell, each holding loss by length and passkey accuracy."""
    from harness.main import main

    summary, client = train_tiny("model=modern", "task=clm", "export=hf", "trainer.max_steps=6")
    folder = client.download_artifacts(summary.run_id, "hf_model")
    monkeypatch.setattr("sys.argv", ["posbench", "hf-eval", folder, "--scalings", "none,linear,yarn", "--factors", "2",
                                     "--lengths", "32,128", "--budget", "256", "--passkey-trials", "2", "--depths",
                                     "0,1", "--tracking-uri", store])
    assert main() == 0
    exp = client.get_experiment_by_name("hf-eval")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kind") == "hf-eval")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted((r.data.tags["scaling"], r.data.tags["factor"]) for r in children) == \
        [("linear", "2"), ("none", "1"), ("yarn", "2")]
    for r in [parent, *children]:
        assert r.info.status == "FINISHED"
    none = next(r for r in children if r.data.tags["scaling"] == "none").data.metrics
    linear = next(r for r in children if r.data.tags["scaling"] == "linear").data.metrics
    assert 0 < none["val/loss_at_32"] < 8 and none["val/ppl_at_32"] == pytest.approx(math.exp(none["val/loss_at_32"]))
    assert linear["val/loss_at_32"] != none["val/loss_at_32"]  # the scaling reached the model's rotary module
    assert {"passkey/acc_at_128", "passkey/acc_at_128_depth_0", "passkey/acc_at_128_depth_1"} <= set(none)
    assert "passkey/acc_at_32" not in none  # the needle and question do not fit in 32 bytes: no figure
    report = Path(client.download_artifacts(parent.info.run_id, "hf_eval.md")).read_text()
    assert "| none | 1 |" in report and "| yarn | 2 |" in report
    assert "parent run" in capsys.readouterr().out
