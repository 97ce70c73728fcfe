"""Packed documents: positions that restart at each document (model.restart_positions) and no
attention across documents (model.document_mask), for every scheme, from the data sources that know where their
documents start to the model, read back from MLflow.

The defining property: with both on, each document of a packed window gets the logits it gets alone, in fp64 to
round-off, for every scheme that takes positions per row; a scheme that cannot is refused with its reason.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from attention.base import AttentionContext, count_keys
from harness.config.load import load
from harness.data.corpus import Embedded, block_split, joined_starts, split_starts
from harness.data.windows import TrainWindows, with_document_ids
from harness.errors import ConfigError, IncompatiblePairing
from positional.base import document_positions

SCHEMES = [
    "alibi",
    "cope",
    "dd_alibi",
    "fire",
    "fox",
    "kerple",
    "learned",
    "none",
    "p_rope",
    "pope",
    "rope",
    "rope_trainable",
    "sinusoidal",
    "t5",
    "xl",
    "xpos",
]
# Refused, with the reason the refusal names: (scheme, causal) -> a phrase of it
REFUSED = {
    ("xl", True): "rel_shift",
    ("xl", False): "rel_shift",
    ("fire", False): "reads the last position",
    ("fox", False): "bidirectional task",
}
READS_NO_POSITION = {"none", "cope", "fox", "dd_alibi"}  # nothing to restart: restart_positions changes nothing
ABSOLUTE = {"learned", "sinusoidal"}  # positions added to the embeddings: a window's offset shows without a restart


@functools.cache
def _spec(pos: str, restart: bool, mask: bool, attn: str):
    """The cell's RunSpec, loaded once for the module: a causal and a bidirectional model share it (the model is
    built from it afresh each time)."""
    return load(
        [
            f"pos={pos}",
            f"attn={attn}",
            f"model.restart_positions={restart}",
            f"model.document_mask={mask}",
            "model.dropout=0",
            "model.n_layers=2",
            "model.d_model=32",
            "model.n_heads=2",
            "model.d_ff=64",
        ]
    )


def model(pos: str, causal: bool, restart: bool = True, mask: bool = True, attn: str = "softmax"):
    from harness.model.transformer import Transformer

    spec = _spec(pos, restart, mask, attn)
    torch.manual_seed(0)
    built = Transformer(spec.model, 40, 32, causal, spec.pos.factory(), spec.attn.factory())
    if pos == "xpos":  # ζ^(n/B) with the default B = 512 is ~1 over 16 positions: a shorter B makes the test bite
        built.pos.scale_base = 8.0
    return built.double().eval()


def packed(rows: list[list[int]], vocab: int = 40, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of documents of the given lengths, one row each: (ids, document_ids), (B, T) each."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(rows), sum(rows[0])), generator=g)
    docs = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in rows])
    return ids, docs


def test_document_positions_restart_at_each_document():
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 5, 5]])
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("pos", SCHEMES)
def test_each_document_of_a_packed_window_gets_the_logits_it_gets_alone(pos, causal):
    if (pos, causal) in REFUSED:
        with pytest.raises(IncompatiblePairing, match=REFUSED[pos, causal]):
            model(pos, causal)
        return
    m = model(pos, causal)
    rows = [[5, 11], [9, 3, 4]]  # two windows of 16, documents cut differently in each
    ids, docs = packed(rows)
    with torch.no_grad():
        both = m(ids, None, docs)
        for r, row in enumerate(rows):
            start = 0
            for n in row:
                alone = m(ids[r : r + 1, start : start + n])
                torch.testing.assert_close(both[r : r + 1, start : start + n], alone, rtol=0, atol=1e-12)
                start += n


@pytest.mark.parametrize("pos", ["rope", "alibi", "t5", "xl", "learned", "sinusoidal"])
def test_the_mask_alone_isolates_relative_schemes_but_not_absolute_ones(pos):
    """Without a restart the second document sits at positions 5 … 15: a relative score is the same there (it reads
    i − j inside the document), an absolute embedding is not."""
    m = model(pos, causal=True, restart=False)
    ids, docs = packed([[5, 11]])
    with torch.no_grad():
        gap = (m(ids, None, docs)[:, 5:] - m(ids[:, 5:])).abs().max().item()
    assert (gap > 1e-6) if pos in ABSOLUTE else (gap < 1e-12), gap


@pytest.mark.parametrize("pos", ["rope", "learned", "t5", "none", "fox"])
def test_a_restart_alone_moves_positions_but_lets_attention_cross(pos):
    """Restarted positions without the mask: a scheme with positions sees the second document from 0 (its logits
    change against the window read whole), one without sees nothing to restart (identical)."""
    ids, docs = packed([[5, 11]])
    restarted, whole = model(pos, True, restart=True, mask=False), model(pos, True, restart=False, mask=False)
    with torch.no_grad():
        gap = (restarted(ids, None, docs) - whole(ids, None, docs)).abs().max().item()
    assert (gap == 0.0) if pos in READS_NO_POSITION else (gap > 1e-6), gap  # round-off: 1e-15


@pytest.mark.parametrize("attn", ["local", "performer", "linear"])
def test_a_variant_that_cannot_mask_across_documents_is_refused_with_its_reason(attn):
    with pytest.raises(IncompatiblePairing, match=f"model.document_mask=true with attn={attn}: .+; use attn=softmax"):
        model("rope", True, restart=False, attn=attn)


def test_restarted_positions_reach_kernelized_attention_through_the_rotation():
    """No mask: restarted RoPE positions are a rotation per row, which Performer applies like any other (a
    relative bias would turn positional and be refused)."""
    m = model("rope", True, restart=True, mask=False, attn="performer")
    ids, docs = packed([[5, 11], [16]])
    with torch.no_grad():
        assert torch.isfinite(m(ids, None, docs)).all()
    with pytest.raises(IncompatiblePairing, match="positional logit bias"):
        model("alibi", True, restart=True, mask=False, attn="performer")


def test_length_temperature_counts_the_keys_of_the_querys_document():
    """SSMax's n_i under the mask: keys of the query's own document (up to it, causal; all of it, bidirectional)."""
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    causal = count_keys(7, AttentionContext(causal=True, document_ids=docs), (7, 7))
    assert causal.tolist() == [[[1, 2, 3, 1, 2, 3, 4]]]
    both = count_keys(7, AttentionContext(causal=False, document_ids=docs), (7, 7))
    assert both.tolist() == [[[3, 3, 3, 4, 4, 4, 4]]]


# ---------------------------------------------------------------- the data: where documents start


def test_document_starts_follow_the_block_split_and_mark_its_seams():
    """Against a brute force: label every byte with its document, split, and find where the label or the byte
    order jumps."""
    rng = np.random.default_rng(0)
    parts = [bytes(rng.integers(97, 104, rng.integers(1, 9000))) for _ in range(60)]
    data = b"\n\n".join(parts)
    starts = joined_starts([len(p) for p in parts])
    doc = np.zeros(len(data), dtype=np.int64)
    doc[starts] = 1
    doc = np.cumsum(doc)
    index = np.arange(len(data))
    train, val = split_starts(starts, len(data), 5, 4096)
    for kept, found in ((index // 4096 % 5 != 4, train), (index // 4096 % 5 == 4, val)):
        idx = index[kept]
        jumps = np.flatnonzero(np.r_[True, (np.diff(idx) != 1) | (np.diff(doc[idx]) != 0)])
        assert np.array_equal(jumps, found)
    split_train, _ = block_split(data, 5, 4096)
    assert all(split_train[s - 2 : s] == b"\n\n" for s in train[1:] if s % 4096)  # inside a block: after a gap


def test_the_embedded_corpus_passes_each_docstring_as_a_document():
    source = Embedded()
    corpus = source.load()
    train, val = source.document_starts()
    assert train[0] == 0 and val[0] == 0 and np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)
    assert train[-1] < len(corpus.train) and val[-1] < len(corpus.val)
    assert len(train) > 5000, len(train)  # thousands of docstrings in ~1.9 MB of training text
    inside = [s for s in train[1:200] if s % 4096]  # not a seam: a docstring starts after the blank line
    assert inside and all(corpus.train[s - 2 : s] == b"\n\n" for s in inside)


def test_training_windows_carry_document_ids_aligned_with_their_inputs():
    from harness.data.objectives import CausalLM
    from harness.data.tokenizer import ByteTokenizer

    ids = np.arange(200, dtype=np.uint8)
    firsts = np.zeros(200, dtype=bool)
    firsts[[0, 50, 53, 120]] = True
    clm = CausalLM(tokenizer=ByteTokenizer())
    windows = TrainWindows(ids, 33, 20, 0, clm, firsts)
    for i in range(20):
        example = windows[i]
        start = int(example["input_ids"][0])  # the ids are their own offsets
        expected = np.cumsum(firsts[start : start + 32]) - firsts[start]
        assert example["document_ids"].tolist() == expected.tolist()
        assert example["document_ids"].shape == example["input_ids"].shape
    assert "document_ids" not in with_document_ids({"input_ids": torch.zeros(3)}, None, 0, 3)


def test_a_source_without_document_starts_is_refused():
    from types import SimpleNamespace

    from harness.config.pairings import check_documents

    cfg = SimpleNamespace(restart_positions=True, document_mask=False)
    text = SimpleNamespace(scores_sequences=False)
    with pytest.raises(ConfigError, match="data=enwik8 does not .+use one of those or drop model.restart_positions"):
        check_documents(cfg, object(), None, text, "enwik8")
    synthetic = SimpleNamespace(scores_sequences=True)  # its example is one document: nothing to pass
    assert check_documents(cfg, object(), None, synthetic, "enwik8") is False
