"""Corpus extraction, splits and datasets: deterministic, covering, and refusing bad input."""

import numpy as np
import pytest
import torch

from harness.data.corpus import Embedded, Enwik8, TextFiles, block_split
from harness.data.objectives import IGNORE, CausalLM, MaskedLM
from harness.data.tokenizer import ByteTokenizer
from harness.data.windows import EvalWindows, TrainWindows
from harness.errors import ConfigError


def test_embedded_corpus_is_deterministic_english_prose():
    a, b = Embedded().load(), Embedded().load()
    assert a.sha256 == b.sha256 and a.train == b.train
    assert 1_000_000 < a.size < 4_000_000  # ~2 MB of pydoc topics and docstrings
    assert a.size == len(a.train) + len(a.val) and len(a.sha256) == 64
    assert len(a.val) / a.size == pytest.approx(1 / 20, abs=0.01)
    text = a.train[:200_000].decode("utf-8")
    assert text.count(" the ") > 500


def test_block_split_partitions_every_byte():
    data = bytes(range(256)) * 1000
    train, val = block_split(data, val_every=4, block=100)
    assert len(train) + len(val) == len(data)
    assert val[:100] == data[300:400]  # the 4th block goes to validation
    assert train[:300] == data[:300]


def test_text_files_read_dir_and_refuse_bad_input(tmp_path):
    (tmp_path / "b.txt").write_text("beta " * 1000)
    (tmp_path / "a.txt").write_text("alpha " * 1000)
    corpus = TextFiles(str(tmp_path)).load()
    assert (corpus.train + corpus.val).startswith(b"alpha")  # sorted by path
    with pytest.raises(ConfigError, match="does not exist"):
        TextFiles(str(tmp_path / "missing")).load()
    with pytest.raises(ConfigError, match="data.path"):
        TextFiles(None).load()
    bad = tmp_path / "latin1"
    bad.mkdir()
    (bad / "x.txt").write_bytes("café ".encode("latin-1") * 2000)
    with pytest.raises(ConfigError, match="not UTF-8"):
        TextFiles(str(bad)).load()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ConfigError, match="at least 4 KiB"):
        TextFiles(str(empty)).load()


def test_a_directory_holding_the_file_reads_as_the_file_and_hidden_files_are_left_out(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("alpha beta " * 1000)
    (tmp_path / "corpus" / ".cache").mkdir()
    (tmp_path / "corpus" / ".cache" / "blob").write_bytes(b"\xff\xfe not text")  # would fail the UTF-8 check
    as_file, as_dir = TextFiles(str(tmp_path / "corpus" / "a.txt")), TextFiles(str(tmp_path / "corpus"))
    assert as_dir.sizes() == as_file.sizes()
    assert as_dir.load().sha256 == as_file.load().sha256


def test_unreadable_files_are_named_for_both_sources(tmp_path, monkeypatch):
    """Root reads any file, so the permission is simulated: what the user sees is the message."""
    (tmp_path / "enwik8").write_bytes(b"x" * 10)
    (tmp_path / "a.txt").write_text("text " * 1000)
    monkeypatch.setattr("harness.data.corpus.os.access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=r"a.txt is not readable; fix its permissions \(chmod \+r\)"):
        TextFiles(str(tmp_path / "a.txt")).sizes()
    with pytest.raises(ConfigError, match=r"enwik8 is not readable; fix its permissions"):
        Enwik8(str(tmp_path)).sizes()  # the directory holding it


def test_enwik8_refuses_wrong_file_and_missing_file_without_download(tmp_path):
    fake = tmp_path / "enwik8"
    fake.write_bytes(b"not enwik8")
    with pytest.raises(ConfigError, match="is not enwik8"):
        Enwik8(str(fake)).load()
    with pytest.raises(ConfigError, match="not found"):
        Enwik8(str(tmp_path / "nope"), download=False).load()


def test_enwik8_to_download_with_no_network_is_refused_by_check_as_by_the_run(tmp_path, monkeypatch):
    """The download's precondition is one probe (harness/data/corpus.py ``unreachable``) that sizes() — the validation
    pass — and load() — the run — both meet first: check no longer says ok to a run that cannot fetch its corpus."""
    import urllib.request

    from harness.data import corpus

    def no_download(*args, **kwargs):
        raise AssertionError("nothing may be fetched")

    monkeypatch.setattr(urllib.request, "urlopen", no_download)
    monkeypatch.setattr(corpus, "unreachable", lambda url: f"{url} cannot be reached: [Errno -2] no such name")
    missing = Enwik8(str(tmp_path / "enwik8"))
    line = r"^cannot download enwik8 \(http://mattmahoney.net/dc/enwik8.zip cannot be reached: .*\); fetch .+, unzip"
    for step in (missing.sizes, missing.load):
        with pytest.raises(ConfigError, match=line):
            step()
    monkeypatch.setattr(corpus, "unreachable", lambda url: None)  # reachable: check says ok, the run downloads
    assert missing.sizes() == (90_000_000, 5_000_000)


def test_train_windows_are_reproducible_and_in_range():
    ids = np.arange(1000, dtype=np.int64) % 256
    ds = TrainWindows(ids.astype(np.uint8), 16, n=50, seed=3, objective=CausalLM(ByteTokenizer()))
    a, b = ds[7], ds[7]
    torch.testing.assert_close(a["input_ids"], b["input_ids"])
    starts = {int(ds[i]["input_ids"][0]) for i in range(50)}
    assert len(starts) > 20  # random offsets, not one window repeated
    other = TrainWindows(ids.astype(np.uint8), 16, n=50, seed=4, objective=CausalLM(ByteTokenizer()))
    assert any(not torch.equal(ds[i]["input_ids"], other[i]["input_ids"]) for i in range(5))


def test_two_seeds_read_different_windows_however_long_the_run():
    """Seeds are replicates: seed 1's j-th masked window is not seed 0's (j + 1,000,003)-th, which a paper-scale run
    reaches (eleuther_rotary's: 14M windows); a run's first million windows are those every shorter run read."""
    ids = np.random.default_rng(0).integers(0, 256, 200_000).astype(np.uint8)
    seed0, seed1 = (TrainWindows(ids, 64, 3_000_000, seed, MaskedLM(ByteTokenizer())) for seed in (0, 1))
    for j in (0, 1, 999_999):
        a, b = seed1[j], seed0[j + 1_000_003]
        assert not (torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])), j
    gen = torch.Generator().manual_seed(1 * 1_000_003 + 5)  # seed 1's window 5, as the first million are drawn
    start = int(torch.randint(len(ids) - 64 + 1, (1,), generator=gen))
    window = torch.from_numpy(ids[start : start + 64].astype(np.int64))
    want = MaskedLM(ByteTokenizer()).make_example(window, torch.ones(64, dtype=torch.bool), gen)
    assert all(torch.equal(seed1[5][k], want[k]) for k in ("input_ids", "labels"))


def test_eval_windows_cover_the_split_once_and_pad_the_tail():
    tok = ByteTokenizer()
    ids = (np.arange(100) % 200).astype(np.uint8)
    ds = EvalWindows(ids, 32, MaskedLM(tok), tok.pad_id)
    assert len(ds) == 4  # 32 + 32 + 32 + 4
    last = ds[3]
    assert int(last["key_padding_mask"].sum()) == 4
    assert (last["labels"][4:] == IGNORE).all()
    masks = [ds[i]["labels"] for i in range(4)]
    again = [EvalWindows(ids, 32, MaskedLM(tok), tok.pad_id)[i]["labels"] for i in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(masks, again, strict=True))  # same tokens scored every evaluation
    # CLM: windows of T+1 overlap by one so every next-token target is scored exactly once
    clm = EvalWindows(ids, 33, CausalLM(tok), tok.pad_id)
    scored = sum(int((clm[i]["labels"] != IGNORE).sum()) for i in range(len(clm)))
    assert scored == len(ids) - 1
