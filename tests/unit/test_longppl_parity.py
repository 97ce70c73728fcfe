"""LongPPL (harness/pretrained/measures.py, hf-eval's key/… metrics) against the authors' package, ``longppl``
(Fang et al. 2025): on the same model and text, the same key tokens and the same LongPPL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

longppl = pytest.importorskip("longppl.longppl")  # the test extra installs it


class Recaller(torch.nn.Module):
    """A causal LM that predicts the token K positions back when its input reaches that far, with a confidence set
    by that token's value (so some labels clear LongPPL's thresholds and some do not), uniform otherwise."""

    def __init__(self, period: int, vocab: int = 258):
        super().__init__()
        self.period, self.vocab = period, vocab
        self.device = torch.device("cpu")

    def forward(self, input_ids):
        t = input_ids.shape[1]
        probs = torch.full((1, t, self.vocab), 1 / self.vocab, dtype=torch.float64)
        for i in range(self.period - 1, t):  # position i predicts token i + 1 = token i + 1 − K
            token = int(input_ids[0, i + 1 - self.period])
            p = (0.05, 0.3, 0.95)[token % 3]  # long-context loss 3.0, 1.2, 0.05 nats: LCL fails, passes, passes
            probs[0, i] = (1 - p) / (self.vocab - 1)
            probs[0, i, token] = p
        return type("Out", (), {"logits": probs.log()})()


@pytest.mark.parametrize(("short", "window"), [(8, 2), (12, 3), (16, 4)])
@pytest.mark.parametrize("reach", [0, 1, -1, 2])
def test_key_tokens_and_longppl_equal_the_authors_package(short, window, reach, tmp_path):
    """The recalled token ``short + window + reach`` back: at the short windows' edge (``reach`` 0, 1, −1: a short
    context one token longer or shorter than the authors' would change which labels are key) and beyond it."""
    from transformers import AutoTokenizer

    from harness.data.tokenizer import ByteTokenizer
    from harness.pretrained.export import tokenizer_files
    from harness.pretrained.hf_eval import EvalSpec, find_key_tokens, measure

    for name, text in tokenizer_files(ByteTokenizer(), 4096).items():
        (tmp_path / name).write_text(str(text))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    g = torch.Generator().manual_seed(short)
    period = short + window + (short if reach == 2 else reach)
    text = "".join(chr(97 + int(c)) for c in torch.randint(0, 26, (period,), generator=g)) * 8
    text = text[: short + (len(text) - short) // window * window]  # whole short windows (longppl's last one of a
    # single token is a 0-d tensor it cannot iterate)
    model, ids = Recaller(period), torch.tensor(tokenizer.encode(text))
    assert len(ids) == len(text)  # ASCII: one byte, one token

    spans = longppl.find_key_token(text, model, tokenizer, short, window)
    offsets = tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    theirs = longppl.cal_overlap(offsets, spans.tolist())  # label indices: token i is label i − 1
    spec = EvalSpec(Path("."), lengths=(len(ids),), budget=len(ids) - 1, key_short=short, passkey_trials=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("harness.pretrained.rotary.apply_scaling", lambda *a, **k: None)  # no rotary in this model
        keys = find_key_tokens(model, ids, spec)
    ours = keys[len(ids)].nonzero().flatten().tolist()
    assert ours == theirs and 0 < len(ours) < len(ids) - period  # some labels are key, some are not
    metrics, _ = measure(model, None, ids, spec, keys)
    expected = longppl.compute_longppl(text, model, model, tokenizer, tokenizer, None, short, window)
    assert expected["n_key_token"] == len(ours)
    assert metrics[f"key/ppl_at_{len(ids)}"] == pytest.approx(float(expected["longppl"]), rel=1e-6)
