"""Pre-tokenized shards: prepare writes the ids once (+ manifest), data=tokens trains from them with random or
sequential windows, each DDP rank in its own slice; a manifest of another tokenizer is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness.data.corpus import TextFiles
from harness.data.objectives import CausalLM, MaskedLM
from harness.data.shards import ShardedIds, TokenShards, token_dtype
from harness.data.subword import BPE
from harness.data.tokenizer import ByteTokenizer
from harness.data.windows import ContinueFrom, TrainWindows, rank_slice
from harness.errors import ConfigError
from harness.main import COMMANDS
from harness.main import prepare_shards as prepare
from tests.helpers import validated

main = COMMANDS["prepare"]


def text(n_lines: int = 1500) -> bytes:
    return "".join(
        f"Line {i}: positions {i % 13} and attention {i % 7} in a transformer.\n" for i in range(n_lines)
    ).encode()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_bytes(text())
    return path


@pytest.fixture(scope="module")
def byte_shards(corpus_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "byte"
    prepare(out, ["data=text", f"data.path={corpus_file}"], shard_tokens=10_000)
    return out


def test_rank_slices_partition_the_tokens_as_a_function_of_rank_and_world_size():
    for n in (0, 1, 7, 100, 1001, 2**20 + 3):
        for world in (1, 2, 3, 8):
            slices = [rank_slice(n, r, world) for r in range(world)]
            assert slices[0][0] == 0 and slices[-1][1] == n  # they cover every token …
            assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))  # … once, in rank order
            sizes = [end - start for start, end in slices]
            assert max(sizes) - min(sizes) <= 1
            assert slices == [rank_slice(n, r, world) for r in range(world)]  # pure
    assert rank_slice(10, 1, 2) == (5, 10)
    with pytest.raises(ValueError):
        rank_slice(10, 2, 2)


def test_sharded_ids_slice_across_shards_as_one_array():
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 60000, n, dtype=np.uint16) for n in (5, 0, 17, 1, 9)]
    whole, ids = np.concatenate(parts), ShardedIds(parts)
    assert len(ids) == len(whole)
    for a in range(len(whole) + 1):
        for b in range(a, len(whole) + 2):
            assert np.array_equal(ids[a:b], whole[a:b])


def test_prepare_writes_the_ids_once_with_a_manifest(byte_shards, corpus_file):
    manifest = json.loads((byte_shards / "manifest.json").read_text())
    corpus = TextFiles(str(corpus_file)).load()
    assert manifest["dtype"] == "uint16" and manifest["corpus"]["sha256"] == corpus.sha256
    assert manifest["tokenizer"]["digest"] == ByteTokenizer().digest() and manifest["tokenizer"]["recipe"] is None
    train = manifest["splits"]["train"]
    assert train["tokens"] == train["bytes"] == len(corpus.train) and len(train["shards"]) > 1  # 10,000 ids a shard
    loaded = TokenShards(str(byte_shards)).load()
    assert bytes(np.asarray(loaded.train_ids[0 : len(loaded.train_ids)]).astype(np.uint8)) == corpus.train
    assert bytes(np.asarray(loaded.val_ids[0 : len(loaded.val_ids)]).astype(np.uint8)) == corpus.val
    assert loaded.val_bytes_per_token == 1.0
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32


def test_random_windows_of_one_process_are_those_of_the_text(byte_shards, corpus_file):
    ids = TokenShards(str(byte_shards)).load().train_ids
    plain = np.frombuffer(TextFiles(str(corpus_file)).load().train, dtype=np.uint8)
    for objective in (CausalLM(ByteTokenizer()), MaskedLM(ByteTokenizer())):
        ours = TrainWindows(ids, 65, 20, 3, objective)
        theirs = TrainWindows(plain, 65, 20, 3, objective)
        for i in range(20):
            assert all(torch.equal(ours[i][k], theirs[i][k]) for k in ("input_ids", "labels", "key_padding_mask"))


@pytest.mark.parametrize("windows", ["random", "sequential"])
def test_each_rank_reads_only_its_own_slice(windows):
    ids = np.arange(10_000, dtype=np.uint32)  # a token's id is its position
    world = 4
    data = TrainWindows(ids, 33, 400, 0, CausalLM(ByteTokenizer()), windows=windows, world_size=world, stride=32)
    for rank in range(world):
        lo, hi = rank_slice(len(ids), rank, world)
        starts = [int(data[g]["input_ids"][0]) for g in ContinueFrom(data, 0, rank, world)]
        assert starts and all(lo <= s and s + 33 <= hi for s in starts)
        if windows == "sequential":  # consecutive, sharing the shifted token: every next token is a target once
            assert starts[:5] == [lo + 32 * k for k in range(5)]


def test_sequential_windows_wrap_around_the_slice():
    ids = np.arange(100, dtype=np.uint16)
    data = TrainWindows(ids, 30, 10, 0, CausalLM(ByteTokenizer()), windows="sequential", stride=30)
    assert [int(data[g]["input_ids"][0]) for g in range(5)] == [0, 30, 60, 0, 30]


def run(train_tiny, *overrides):
    summary, client = train_tiny(*overrides, "trainer.max_steps=3", "trainer.val_check_interval=3")
    return summary, client.get_run(summary.run_id)


def test_training_from_shards_equals_training_from_the_text(byte_shards, corpus_file, train_tiny_shared):
    """The byte tokenizer's shards hold the text's bytes: the same seed reads the same windows, so the run is
    the same run (loss, bits/byte, corpus identity)."""
    from_text, text_run = run(train_tiny_shared, "data=text", f"data.path={corpus_file}", "task=clm")
    from_ids, ids_run = run(train_tiny_shared, "data=tokens", f"data.path={byte_shards}", "task=clm")
    assert from_ids.val_loss == pytest.approx(from_text.val_loss, rel=1e-6)
    assert from_ids.val_bpc == pytest.approx(from_text.val_bpc, rel=1e-6)
    assert ids_run.data.tags["corpus_sha256"] == text_run.data.tags["corpus_sha256"]
    sequential, _ = run(train_tiny_shared, "data=tokens", f"data.path={byte_shards}", "data.windows=sequential")
    assert np.isfinite(sequential.val_loss)


def test_a_trained_vocabulary_is_read_back_and_another_tokenizer_refused(
    corpus_file, tmp_path, monkeypatch, train_tiny_shared
):
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    out = tmp_path / "bpe"
    assert main([str(out), "data=text", f"data.path={corpus_file}", "tokenizer=bpe", "tokenizer.vocab_size=300"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    corpus = TextFiles(str(corpus_file)).load()
    tok = BPE(vocab_size=300)
    tok.fit(corpus)
    assert manifest["tokenizer"]["digest"] == tok.digest()
    loaded = TokenShards(str(out)).load()
    assert np.array_equal(np.asarray(loaded.val_ids[0 : len(loaded.val_ids)]), tok.encode(corpus.val))
    assert loaded.val_bytes_per_token == len(corpus.val) / len(tok.encode(corpus.val))
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "empty-cache")  # another machine: no cache
    summary, _ = run(
        train_tiny_shared, "data=tokens", f"data.path={out}", "tokenizer=bpe", "tokenizer.vocab_size=300", "task=clm"
    )
    assert summary.val_bpc == pytest.approx(summary.val_loss / (loaded.val_bytes_per_token * np.log(2)))
    with pytest.raises(
        ConfigError,
        match=r"was tokenized with tokenizer=bpe \{.*\}, not tokenizer=bpe .*'vocab_size'"
        r": 512",
    ):
        checked("data=tokens", f"data.path={out}", "tokenizer=bpe", "tokenizer.vocab_size=512")
    with pytest.raises(
        ConfigError,
        match=r"was tokenized with tokenizer=bpe \(digest .*\), not with the configured "
        r"tokenizer=byte",
    ):
        checked("data=tokens", f"data.path={out}")
    tok.tokenizer.save(str(tmp_path / "tokenizer.json"))  # the same vocabulary, by path: its digest matches
    checked("data=tokens", f"data.path={out}", "tokenizer=bpe", f"tokenizer.path={tmp_path / 'tokenizer.json'}")


def checked(*overrides):
    return validated(*overrides)


@pytest.mark.parametrize("val_by", ["document", "block"])
def test_streamed_prepare_writes_what_the_in_memory_one_does(tmp_path, val_by):
    datasets = pytest.importorskip("datasets")
    rows = [f"Row {i} of a streamed corpus, é and ü in it: {'x' * (i % 50)}" for i in range(3000)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "ds"))
    common = ["data=hf", f"data.path={tmp_path / 'ds'}", f"data.val_by={val_by}"]
    memory = prepare(tmp_path / "memory", common)
    stream = prepare(tmp_path / "stream", [*common, "data.streaming=true"])
    assert memory == stream  # same corpus hashes, token and byte counts
    for split in ("train", "val"):
        a, b = (TokenShards(str(tmp_path / kind)).load().ids(split) for kind in ("memory", "stream"))
        assert np.array_equal(a[0 : len(a)], b[0 : len(b)]) and len(a) > 0


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
@pytest.mark.parametrize("val_split", [None, "block", "validation"])  # None: whole rows (data.val_by=document)
def test_a_vocabulary_trained_from_a_stream_is_the_in_memory_one(tmp_path, kind, val_split, monkeypatch):
    """tokenizer=bpe/wordpiece on a streamed corpus: trained in a first pass over the training blocks as they
    stream, never holding the corpus — the same tokenizer.json and the same shards as the in-memory prepare
    (multi-byte characters cut at block boundaries included; with a named validation split too)."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")  # trained here, not read from a cache
    rows = [f"Row {i} of a streamed corpus, é and ü in it: {'xyz ' * (i % 40)}" for i in range(4000)]
    ds = datasets.Dataset.from_dict({"text": rows})
    named = val_split == "validation"
    (datasets.DatasetDict(train=ds, validation=ds.select(range(300))) if named else ds).save_to_disk(
        str(tmp_path / "ds")
    )
    common = [
        "data=hf",
        f"data.path={tmp_path / 'ds'}",
        f"tokenizer={kind}",
        "tokenizer.vocab_size=400",
        *(["data.val_split=validation"] if named else ["data.val_by=block"] if val_split else []),
    ]
    memory = prepare(tmp_path / "memory", common)
    stream = prepare(tmp_path / "stream", [*common, "data.streaming=true"])
    assert memory == stream  # corpus hashes, the tokenizer's digest and recipe, token and byte counts
    assert (tmp_path / "memory" / "tokenizer.json").read_text() == (tmp_path / "stream" / "tokenizer.json").read_text()
    for split in ("train", "val"):
        a, b = (TokenShards(str(tmp_path / k)).load().ids(split) for k in ("memory", "stream"))
        assert np.array_equal(a[0 : len(a)], b[0 : len(b)]) and len(a) > 0


def test_stream_chunks_are_line_chunks_of_the_join():
    from harness.data.subword import line_chunks, stream_chunks

    text = "".join(f"line {i} {'é' * (i % 7)}\n" for i in range(500))
    for cut in (1, 7, 100, 3000):
        pieces = [text[i : i + cut] for i in range(0, len(text), cut)]
        assert list(stream_chunks(pieces, size=64)) == list(line_chunks(text, size=64))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data=tokens"], "data=tokens needs the folder posbench prepare wrote: add data.path=DIR"),
        (["data=tokens", "data.path={tmp}"], "has no manifest.json; write one with posbench prepare"),
        (["data=tokens", "data.path={shards}", "data.windows=shuffled"], "data.windows='shuffled': use data.windows="),
        (
            ["data=tokens", "data.path={shards}", "task=copy"],
            "data=tokens holds token ids of text for task=mlm or task=",
        ),
        (["+data.windows=sequential"], "data=embedded does not read data.windows"),
    ],
)
def test_bad_input_is_one_line(overrides, message, byte_shards, tmp_path):
    with pytest.raises(ConfigError) as e:
        checked(*(o.format(tmp=tmp_path, shards=byte_shards) for o in overrides))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_truncated_shard_is_refused(byte_shards, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(byte_shards, copy)
    (copy / "train-00001.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ConfigError, match=r"train-00001.bin is 10 bytes, the manifest says 20000"):
        TokenShards(str(copy)).sizes()
    with pytest.raises(ConfigError, match="already holds prepared shards"):
        prepare(copy, ["data=text", "data.path=/nonexistent"])


def test_workers_make_the_same_batches_and_shards_pickle_as_their_files(byte_shards):
    import pickle

    from harness.data.loaders import make_loaders

    corpus = TokenShards(str(byte_shards)).load()
    again = pickle.loads(pickle.dumps(corpus.train_ids))
    assert len(pickle.dumps(corpus.train_ids)) < 2000  # file names, not the ids
    assert np.array_equal(again[100:30_000], corpus.train_ids[100:30_000])
    task = MaskedLM(ByteTokenizer())
    batches = [list(make_loaders(corpus, task, 32, 4, n_train=24, seed=1, num_workers=w)[0]) for w in (0, 2)]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(*batches, strict=True) for k in a)


def test_prepare_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "data=text", f"data.path={tmp_path / 'missing.txt'}"]) == 2
    assert main([str(tmp_path / "out"), "data=nope"]) == 2
    assert main([str(tmp_path / "out"), "--shard-tokens", "0"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: data.path=") and "does not exist" in lines[0]
    assert lines[1].startswith("error: Could not find 'data/nope'; use one of data=embedded, ")
    assert lines[2] == "error: --shard-tokens=0 must be a positive number of token ids" and len(lines) == 3
    assert not (tmp_path / "out").exists()


def test_loader_bench_flops_and_shapes():
    from harness.bench.loader import paper_shapes, train_flops_per_token

    shapes = paper_shapes("grid")
    assert shapes == {"n_layers": 12, "d_model": 768, "d_ff": 3072, "seq_len": 512, "batch_size": 64}
    # 6·N + 6·L·T·d with N = 12·(4·768² + 2·768·3072) + 768·258 = 85,132,800 (Kaplan et al. 2020, Table 1)
    assert train_flops_per_token(shapes, 258) == 6 * 85_132_800 + 6 * 12 * 512 * 768


@pytest.mark.parametrize(
    "out,words",
    [
        ("", "DIR '' names no folder; give one"),
        ("/proc/posbench-shards", "DIR: cannot write /proc/posbench-shards ("),
        ("{file}/sub", "file is not a directory); choose another DIR"),
    ],
)
def test_prepare_refuses_a_folder_it_cannot_write_before_reading_the_corpus(out, words, tmp_path, capsys, monkeypatch):
    """DIR '', a file or a folder that cannot be made is one line, exit 2, nothing written in the working
    directory."""
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert main([out.format(file=tmp_path / "file"), "data=embedded"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written here


def _copy(folder, tmp_path):
    import shutil
    from pathlib import Path

    return Path(shutil.copytree(folder, tmp_path / "copy"))


def _resealed(folder, edit=lambda manifest: None):
    """The folder's manifest with its shards' digests taken again (as if prepare had written these bytes), edited by
    ``edit``, and sealed again: what a checksum cannot catch."""
    import hashlib

    from harness import integrity
    from harness.data.shards import block_digest

    manifest = integrity.read(folder / "manifest.json", "")
    size = manifest["block_bytes"]
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            data = (folder / entry["file"]).read_bytes()
            entry["sha256"] = integrity.sha256(data)
            entry["blocks"] = [block_digest(hashlib.sha256(data[i : i + size])) for i in range(0, len(data), size)]
    edit(manifest)
    integrity.write(folder / "manifest.json", manifest)


def test_a_shard_overwritten_with_other_bytes_is_refused_when_a_window_reaches_them(byte_shards, tmp_path):
    """Random bytes of the right size are caught by the shard's sha256 before any window; with digests that match
    them (prepare's own mistake), an id past the vocabulary is one line naming the shard when a window reads it,
    not an IndexError in the embedding."""
    folder = _copy(byte_shards, tmp_path)
    shard = folder / "train-00000.bin"
    shard.write_bytes(np.random.default_rng(0).integers(0, 2**16, shard.stat().st_size // 2, dtype=np.uint16).tobytes())
    with pytest.raises(ConfigError, match=r"train-00000.bin is damaged \(its sha256"):  # caught before any window
        TokenShards(str(folder)).sizes()
    _resealed(folder)
    TokenShards(str(folder)).sizes()  # the sizes still agree with the manifest
    corpus = TokenShards(str(folder)).load()
    with pytest.raises(ConfigError) as e:
        corpus.train_ids[0:64]
    assert str(e.value).startswith(f"{shard} holds token id ") and "not below the vocabulary size 258" in str(e.value)
    assert np.asarray(corpus.val_ids[0:64]).max() < 258  # the intact shards still read


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda m: m["splits"]["train"].pop("bytes"), "(KeyError: no 'bytes')"),
        (lambda m: m["tokenizer"].update(vocab_size="abc"), "(ValueError: invalid literal for int()"),
        (lambda m: m["splits"]["val"]["shards"][0].update(file="../../etc/passwd"), "(ValueError: shard '../../etc"),
        (lambda m: m.update(splits=[]), "(TypeError: list indices must be integers"),
    ],
)
def test_an_edited_manifest_is_one_line(edit, words, byte_shards, tmp_path):
    """An edited manifest.json is one line: caught by its seal, or, sealed again after the edit, by its structure,
    never a traceback."""
    folder = _copy(byte_shards, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"manifest.json is damaged \(its content no longer matches its sha256\)"):
        TokenShards(str(folder)).sizes()
    _resealed(_copy(byte_shards, tmp_path / "again"), edit)  # sealed after the edit: the structure is still checked
    folder = tmp_path / "again" / "copy"
    with pytest.raises(ConfigError) as e:
        TokenShards(str(folder)).sizes()
    assert str(e.value).startswith(f"{folder / 'manifest.json'} is damaged ") and words in str(e.value)
    assert str(e.value).endswith("write the folder again with posbench prepare")


def test_a_swapped_vocabulary_beside_the_shards_is_refused(corpus_file, tmp_path, monkeypatch):
    """Another valid tokenizer.json in the shard folder is refused, not used silently."""
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    out = tmp_path / "bpe"
    prepare(out, ["data=text", f"data.path={corpus_file}", "tokenizer=bpe", "tokenizer.vocab_size=300"])
    other = BPE(vocab_size=290)
    other.fit(TextFiles(str(corpus_file)).load())
    other.tokenizer.save(str(out / "tokenizer.json"))
    with pytest.raises(
        ConfigError,
        match=r"tokenizer.json is damaged \(its sha256 .* is not the .* manifest.json "
        r"records\); write the folder again",
    ):
        BPE(vocab_size=300).fit(TokenShards(str(out)).load())  # its bytes, checked before tokenizers parses them


def test_a_vocabulary_trained_on_a_bounded_sample_is_the_same_streamed_or_not(tmp_path, monkeypatch):
    """tokenizer.train_bytes=N trains on the training split's first N bytes (a cut inside a character included):
    streamed (the stream read no further for the vocabulary) and in memory give one tokenizer.json, another than
    the whole split's, and the recipe records N."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    rows = [f"Row {i}: é{'ü' * (i % 9)} and {f'word{i % 97} ' * (i % 13)}" for i in range(4000)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "ds"))
    common = ["data=hf", f"data.path={tmp_path / 'ds'}", "tokenizer=bpe", "tokenizer.vocab_size=400"]
    sample = [*common, "tokenizer.train_bytes=20001"]  # odd: a cut inside a two-byte character
    memory = prepare(tmp_path / "memory", sample)
    stream = prepare(tmp_path / "stream", [*sample, "data.streaming=true"])
    whole = prepare(tmp_path / "whole", common)
    assert memory == stream and memory["tokenizer"]["recipe"]["train_bytes"] == 20001
    read = {k: (tmp_path / k / "tokenizer.json").read_text() for k in ("memory", "stream", "whole")}
    assert read["memory"] == read["stream"] != read["whole"]
    assert "train_bytes" not in whole["tokenizer"]["recipe"]  # shards written before the option still match
    with pytest.raises(ConfigError, match="tokenizer.train_bytes=100 must be a whole number ≥ 4096"):
        prepare(tmp_path / "bad", [*common, "tokenizer.train_bytes=100"])


# ---------------------------------------------------------------- checksums: damage caught before use


def _flip(file, at: int) -> None:
    data = bytearray(file.read_bytes())
    data[at] ^= 0x01  # the low bit of one byte: an id still inside the vocabulary, wrong all the same
    file.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_shard_is_caught_before_use(byte_shards, tmp_path, monkeypatch):
    """prepare records each shard's sha256; every read of a folder small enough to hash whole checks it. One flipped
    bit keeps every id inside the vocabulary, so nothing else would notice: it trained silently before."""
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    folder = _copy(byte_shards, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert all(len(s["sha256"]) == 64 for split in manifest["splits"].values() for s in split["shards"])
    assert TokenShards(str(folder)).sizes()[0] > 0  # whole: accepted
    _flip(folder / "train-00001.bin", 1_234)
    with pytest.raises(
        ConfigError,
        match=r"train-00001.bin is damaged \(its sha256 .* is not the .* manifest.json "
        r"records\); write the folder again with posbench prepare",
    ):
        TokenShards(str(folder)).sizes()


def _large_folder(corpus_file, tmp_path, monkeypatch, block_bytes: int = 1024):
    """A folder read as one too large to hash whole at every start (REHASH_BYTES 0), its blocks ``block_bytes``."""
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    monkeypatch.setattr("harness.data.shards.REHASH_BYTES", 0)
    folder = tmp_path / "large"
    prepare(folder, ["data=text", f"data.path={corpus_file}"], shard_tokens=10_000, block_bytes=block_bytes)
    return folder


def test_a_large_folder_checks_each_block_a_read_reaches_before_it_is_used(corpus_file, tmp_path, monkeypatch):
    """A folder too large to hash whole at every start (hundreds of gigabytes would cost minutes) records the sha256
    of each block of each shard; a read hashes each block it reaches the first time this process reads it. So a bit
    rotted in place after any number of earlier runs — size and mtime unchanged — is refused before a window holding
    it is used, and reads that do not reach it go on."""
    import os

    folder = _large_folder(corpus_file, tmp_path, monkeypatch)
    manifest = json.loads((folder / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][1]
    assert manifest["block_bytes"] == 1024 and len(shard["blocks"]) == -(-2 * shard["tokens"] // 1024)  # uint16
    corpus = TokenShards(str(folder)).load()
    ids = corpus.train_ids
    first, clean = ids[10_000:30_000].copy(), ids[0:50]
    assert ids.blocks[1] == shard["blocks"] and len(ids._checked_blocks[1]) == len(shard["blocks"])
    file = folder / "train-00001.bin"
    info = file.stat()
    _flip(file, 5_000)  # block 4 of shard 1 (bytes 4,096 …): id 12,500
    os.utime(file, ns=(info.st_atime_ns, info.st_mtime_ns))  # in place: a stamp or a size check would not see it
    fresh = TokenShards(str(folder)).load().train_ids  # the next process: nothing read yet, so nothing refused
    assert np.array_equal(fresh[0:50], clean) and np.array_equal(fresh[10_000:12_000], first[:2_000])
    with pytest.raises(
        ConfigError,
        match=r"train-00001.bin is damaged: its bytes 4096–5120 do not hash to the "
        r"digest manifest.json records .*; write the folder again with posbench "
        r"prepare",
    ):
        fresh[12_000:12_600]  # a window crossing into the damaged block
    assert np.array_equal(fresh[16_000:17_000], first[6_000:7_000])  # other blocks still read


def test_a_large_folders_blocks_are_checked_in_a_data_loader_worker(corpus_file, tmp_path, monkeypatch):
    """A spawned DataLoader worker receives the shards as files and digests (``ShardedIds.__reduce__``) and checks
    the blocks it reads itself; the damage reaches the run as the same one line."""
    import pickle

    folder = _large_folder(corpus_file, tmp_path, monkeypatch)
    ids = TokenShards(str(folder)).load().train_ids
    _flip(folder / "train-00000.bin", 3_000)
    worker = pickle.loads(pickle.dumps(ids))
    assert worker.blocks == ids.blocks and worker.block_bytes == 1024
    with pytest.raises(ConfigError, match=r"train-00000.bin is damaged: its bytes 2048–3072"):
        worker[1_400:1_600]


def test_a_bit_rotted_in_place_in_a_small_folder_is_caught_by_the_next_process(byte_shards, tmp_path, monkeypatch):
    """Size and mtime unchanged (a disk's bit rot, not an edit): a folder under REHASH_BYTES is hashed again by each
    process that reads it, so the next run refuses it, however many runs read it whole before."""
    import os

    import harness.data.shards as shards

    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    folder = _copy(byte_shards, tmp_path)
    assert TokenShards(str(folder)).sizes()[0] > 0
    shard = folder / "train-00001.bin"
    info = shard.stat()
    _flip(shard, 777)
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns))  # as if in place
    monkeypatch.setattr(shards, "_VERIFIED", set())  # the next process
    with pytest.raises(ConfigError, match=r"train-00001.bin is damaged"):
        TokenShards(str(folder)).sizes()


def test_an_edited_manifest_is_caught_and_one_of_another_format_refused(byte_shards, tmp_path, monkeypatch):
    from harness import integrity

    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    folder = _copy(byte_shards, tmp_path)
    file = folder / "manifest.json"
    manifest = json.loads(file.read_text())  # with its seal
    file.write_text(json.dumps({**manifest, "corpus": {**manifest["corpus"], "name": "another corpus"}}))  # a lie
    with pytest.raises(ConfigError, match=r"manifest.json is damaged \(its content no longer matches its sha256\)"):
        TokenShards(str(folder)).sizes()
    integrity.write(file, {**manifest, "format": "posbench-tokens-1"})  # an earlier posbench's folder
    with pytest.raises(
        ConfigError,
        match=r"manifest.json is not a posbench-tokens-2 manifest \(an earlier "
        r"posbench's, or another program's\); write the folder again",
    ):
        TokenShards(str(folder)).sizes()


@pytest.mark.parametrize(
    "argv, words",
    [([], "the following arguments are required: out"), (["x", "--shard-tokens", "many"], "invalid int value: 'many'")],
)
def test_prepare_usage_mistakes_are_one_line(argv, words, capsys):
    """argparse's usage block was three lines; the tools share harness.errors.OneLineParser."""
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and words in line and line.endswith("see posbench prepare --help")


@pytest.mark.parametrize(
    "value, limit",
    [(None, 1 << 30), ("0", 0), ("5000000000", 5_000_000_000), ("-1", None), ("1GB", None), ("", None), ("1e9", None)],
)
def test_the_whole_hash_limit_is_a_whole_number_of_bytes(value, limit, monkeypatch):
    from harness.data.shards import HASH_WHOLE_ENV, hash_whole_bytes

    if value is None:
        monkeypatch.delenv(HASH_WHOLE_ENV, raising=False)
    else:
        monkeypatch.setenv(HASH_WHOLE_ENV, value)
    if limit is not None:
        assert hash_whole_bytes() == limit
    else:
        with pytest.raises(ConfigError, match=rf"POSBENCH_HASH_WHOLE_BYTES='{value}' must be a whole number of bytes"):
            hash_whole_bytes()
