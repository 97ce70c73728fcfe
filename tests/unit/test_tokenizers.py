"""Subword tokenizers (bpe, wordpiece trained on the training split; hf from a saved folder): trained once and
cached by the split's hash, loaded from tokenizer.json, the vocabulary's own special tokens in MLM masking,
whole-word masking, and bits per byte that compare across vocabularies. Offline: every tokenizer is built here."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest
import torch

from harness.data import subword
from harness.data.corpus import Corpus, block_split
from harness.data.objectives import IGNORE, CausalLM, MaskedLM
from harness.data.subword import BPE, Pretrained, WordPiece, train_tokenizer
from harness.data.tokenizer import ByteTokenizer, bytes_per_token
from harness.errors import ConfigError

WORDS = [
    "position",
    "positional",
    "encoding",
    "encodings",
    "rotary",
    "relative",
    "absolute",
    "attention",
    "transformer",
    "transformers",
    "the",
    "a",
    "of",
    "and",
    "extrapolation",
    "length",
    "lengths",
    "bias",
]


SYLLABLES = ["ka", "lo", "mi", "ter", "zun", "pra", "vel", "dos", "qui", "ny"]


def make_text(n_words: int = 12_000, seed: int = 0) -> bytes:
    """Sentences of common words and made-up ones (syllable strings: too many to each get an id)."""
    rng = random.Random(seed)
    lines, line = [], []
    for _ in range(n_words):
        line.append(
            rng.choice(WORDS)
            if rng.random() < 0.6
            else "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        )
        if len(line) == 12:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    return "\n".join(lines).encode()


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    data = make_text()
    return Corpus("test", *block_split(data, 20), hashlib.sha256(data).hexdigest(), len(data))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    return tmp_path / "cache"


@pytest.mark.parametrize("cls", [BPE, WordPiece])
def test_trained_vocabularies_round_trip_and_keep_the_specials_first(cls, corpus, cache):
    tok = cls(vocab_size=300, min_frequency=1)
    tok.fit(corpus)
    ids = tok.encode(corpus.val)
    assert ids.dtype == np.uint16 and 0 < len(ids) < len(corpus.val) and int(ids.max()) < tok.vocab_size
    assert tok.tokenizer.get_vocab_size() <= 300
    assert [tok.tokenizer.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (tok.pad_id, tok.mask_id) == (0, 4) and not set(tok.special_ids) & set(ids.tolist())
    text = corpus.val.decode()
    decoded = tok.decode(ids)
    if cls is BPE:
        assert decoded == text  # byte-level BPE is lossless
    else:
        assert decoded.replace(" ", "") == text.lower().replace(" ", "").replace("\n", "")  # lower-cased


@pytest.mark.parametrize("cls", [BPE, WordPiece])
def test_special_tokens_written_in_the_text_are_text(cls, corpus, cache, tmp_path):
    """A corpus that writes "[MASK]" or "[CLS]" (code, docs about BERT) gives the tokens of that text, never the
    special ids: a literal [MASK] read as the mask id would be a masked position masked LM never chose, and the
    model would score it as one. Loaded from its cache or from tokenizer.path, the same vocabulary encodes alike."""
    text = b"Use [MASK] and [CLS] and [PAD] as [SEP] says [UNK]."
    tok = cls(vocab_size=300, min_frequency=1)
    tok.fit(corpus)
    ids = tok.encode(text).tolist()
    assert not set(tok.special_ids) & set(ids) - {tok.tokenizer.token_to_id("[UNK]")}, ids
    assert "mask" in tok.decode(ids).lower() and "cls" in tok.decode(ids).lower()
    cached = cls(vocab_size=300, min_frequency=1)
    cached.fit(corpus)
    tok.tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = cls(path=str(tmp_path / "tokenizer.json"))
    assert cached.encode(text).tolist() == loaded.encode(text).tolist() == ids


def test_a_second_run_loads_the_cached_vocabulary_instead_of_training(corpus, cache, monkeypatch):
    first = BPE(vocab_size=300)
    first.fit(corpus)
    files = list((cache / "tokenizers").glob("bpe-v300-*.json"))
    assert len(files) == 1 and hashlib.sha256(corpus.train).hexdigest()[:20] in files[0].name

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(subword, "train_tokenizer", no_training)
    second = BPE(vocab_size=300)
    second.fit(corpus)
    assert second.digest() == first.digest()
    other = Corpus("other", corpus.train + b" more", corpus.val, "x", 0)  # another training split: trained anew
    with pytest.raises(AssertionError, match="trained again"):
        BPE(vocab_size=300).fit(other)


def test_tokenizer_path_loads_a_saved_vocabulary(corpus, cache, tmp_path):
    trained = WordPiece(vocab_size=300)
    trained.fit(corpus)
    trained.tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = WordPiece(path=str(tmp_path / "tokenizer.json"))
    loaded.fit(corpus)  # nothing to train
    assert loaded.digest() == trained.digest() and np.array_equal(loaded.encode(corpus.val), trained.encode(corpus.val))
    assert (loaded.pad_id, loaded.mask_id, loaded.vocab_size) == (0, 4, trained.tokenizer.get_vocab_size())
    with pytest.raises(ConfigError, match="tokenizer.path=.*/nope.json does not exist"):
        WordPiece(path=str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match=r"tokenizer.vocab_size=999 but tokenizer.path=.* holds \d+ ids"):
        WordPiece(vocab_size=999, path=str(tmp_path / "tokenizer.json"))


def saved_hf(tmp_path, corpus, kind: str, **specials) -> str:
    """A transformers fast tokenizer saved with save_pretrained: what tokenizer.name=DIR reads offline."""
    from transformers import PreTrainedTokenizerFast

    core = train_tokenizer(kind, corpus.train, 300, 1)
    folder = tmp_path / f"hf-{kind}"
    PreTrainedTokenizerFast(tokenizer_object=core, **specials).save_pretrained(str(folder))
    return str(folder)


def test_hf_tokenizer_from_a_saved_folder(corpus, tmp_path):
    from transformers import AutoTokenizer

    folder = saved_hf(
        tmp_path,
        corpus,
        "wordpiece",
        pad_token="[PAD]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )
    tok = Pretrained(folder)
    reference = AutoTokenizer.from_pretrained(folder)
    text = corpus.val.decode()
    assert tok.encode(corpus.val).tolist() == reference(text, add_special_tokens=False)["input_ids"]
    assert (tok.mask_id, tok.pad_id) == (reference.mask_token_id, reference.pad_token_id)
    assert set(tok.special_ids) == set(reference.all_special_ids)
    assert not set(tok.regular_ids().tolist()) & set(reference.all_special_ids)


def test_an_hf_tokenizers_random_replacements_leave_out_every_special_token_it_holds(corpus, tmp_path):
    """A folder whose tokenizer marks [UNK] [CLS] [SEP] special without naming them to transformers (only its pad and
    mask): BERT's random replacement still never draws them."""
    tok = Pretrained(saved_hf(tmp_path, corpus, "bpe", pad_token="[PAD]", mask_token="[MASK]"))
    assert tok.special_ids == [0, 1, 2, 3, 4]
    assert torch.equal(tok.regular_ids(), torch.arange(5, tok.vocab_size))


def test_a_vocabulary_without_a_mask_token_refuses_mlm_and_pads_clm_with_end_of_text(corpus, tmp_path):
    folder = saved_hf(tmp_path, corpus, "bpe", eos_token="[SEP]")  # like gpt2: no mask, no pad
    tok = Pretrained(folder)
    with pytest.raises(ConfigError, match="task=mlm replaces tokens by \\[MASK\\].*use task=clm"):
        MaskedLM(tok)
    assert tok.pad_id == tok.tokenizer.token_to_id("[SEP]")
    CausalLM(tok)


@pytest.mark.parametrize("hub_offline", ["0", "1"])
def test_hf_tokenizer_offline_names_the_fix_at_once(monkeypatch, hub_offline):
    """An unreachable Hub (a refused port) is found in one connection attempt, not by waiting on retries; the user's
    HF_HUB_OFFLINE=1 is taken as it is (no attempt at all)."""
    import huggingface_hub.constants

    from tests.helpers import connections

    monkeypatch.setenv("HF_HUB_OFFLINE", hub_offline)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", hub_offline == "1")
    tried = connections(monkeypatch)
    with pytest.raises(ConfigError) as e:
        Pretrained("posbench-no-such-org/no-such-tokenizer")
    assert len(tried) <= (0 if hub_offline == "1" else 1), tried
    message = str(e.value)
    assert "\n" not in message and message.startswith("tokenizer.name=posbench-no-such-org/no-such-tokenizer: ")
    why = "HF_HUB_OFFLINE is set" if hub_offline == "1" else "http://127.0.0.1:9 cannot be reached"
    assert f"the Hub was not asked ({why}" in message
    assert "save_pretrained('DIR')" in message and "set tokenizer.name=DIR" in message
    with pytest.raises(ConfigError, match="tokenizer=hf needs tokenizer.name=gpt2, bert-base-uncased or a folder"):
        Pretrained(None)


@pytest.mark.parametrize("cls", [BPE, WordPiece])
def test_mlm_masks_with_the_vocabularys_own_mask_and_draws_regular_ids(cls, corpus, cache):
    tok = cls(vocab_size=300)
    tok.fit(corpus)
    ids = torch.from_numpy(tok.encode(corpus.train)[:4096].astype(np.int64))
    mlm = MaskedLM(tok, mask_prob=0.5, p_mask=0.4, p_random=0.4)
    masked, randoms = 0, []
    for i in range(32):
        window = ids[i * 128 : (i + 1) * 128]
        ex = mlm.make_example(window, torch.ones(128, dtype=torch.bool), torch.Generator().manual_seed(i))
        selected = ex["labels"] != IGNORE
        assert torch.equal(ex["labels"][selected], window[selected])
        masked += int((ex["input_ids"] == tok.mask_id).sum())
        changed = selected & (ex["input_ids"] != tok.mask_id) & (ex["input_ids"] != window)
        randoms += ex["input_ids"][changed].tolist()
        assert torch.equal(ex["input_ids"][~selected], window[~selected])
    assert masked > 0.15 * 32 * 128  # 0.5 × 0.4 of the tokens, give or take
    assert randoms and not set(randoms) & set(tok.special_ids)  # BERT's random token: never a special
    assert max(randoms) < tok.tokenizer.get_vocab_size()


def test_byte_masking_is_unchanged_by_the_regular_id_table():
    """The byte tokenizer's random replacement draws as before (randint over its 256 bytes)."""
    tok, window = ByteTokenizer(), torch.arange(64) % 256
    ex = MaskedLM(tok).make_example(window, torch.ones(64, dtype=torch.bool), torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    u_select, u_action = torch.rand(2, 64, generator=gen)
    selected = u_select < 0.15
    random_ids = torch.randint(256, (64,), generator=gen)
    expected = torch.where(
        selected & (u_action < 0.8),
        257,
        torch.where(selected & (u_action >= 0.8) & (u_action < 0.9), random_ids, window),
    )
    assert torch.equal(ex["input_ids"], expected)


def words_of(continues: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(~continues, 0) - 1


@pytest.mark.parametrize("kind", ["byte", "bpe", "wordpiece"])
def test_whole_word_masking_selects_every_token_of_a_word_or_none(kind, corpus, cache):
    if kind == "byte":
        tok = ByteTokenizer()
    else:
        tok = (BPE if kind == "bpe" else WordPiece)(vocab_size=300)
        tok.fit(corpus)
    ids = torch.from_numpy(tok.encode(corpus.train).astype(np.int64))
    mlm = MaskedLM(tok, whole_word=True)
    n_selected = n_tokens = 0
    split_words = 0
    for i in range(40):
        window = ids[i * 96 : (i + 1) * 96]
        ex = mlm.make_example(window, torch.ones(96, dtype=torch.bool), torch.Generator().manual_seed(i))
        selected, word = ex["labels"] != IGNORE, words_of(tok.word_continues(window))
        for w in word.unique():
            in_word = selected[word == w]
            assert in_word.all() or not in_word.any()  # a word is masked whole or not at all
            split_words += int((word == w).sum() > 1)
        n_selected, n_tokens = n_selected + int(selected.sum()), n_tokens + 96
    assert split_words > 40  # words of several tokens were there to split
    assert abs(n_selected / n_tokens - 0.15) < 0.05  # the token masking rate stays about mask_prob


def test_word_boundaries_of_each_vocabulary(corpus, cache):
    byte = ByteTokenizer()
    text = torch.tensor(list(b"Rotary, relative encodings"))
    words = words_of(byte.word_continues(text))
    assert [bytes(text[words == w].tolist()).decode() for w in words.unique()] == [
        "Rotary",
        ",",
        " ",
        "relative",
        " ",
        "encodings",
    ]
    for cls in (BPE, WordPiece):
        tok = cls(vocab_size=300)
        tok.fit(corpus)
        ids = torch.from_numpy(tok.encode(b"Positional extrapolation of transformers").astype(np.int64))
        word = words_of(tok.word_continues(ids))
        pieces = [tok.decode(ids[word == w].tolist()).strip().lower() for w in word.unique()]
        assert [p for p in pieces if p] == ["positional", "extrapolation", "of", "transformers"]  # ' ': a word too


@pytest.mark.parametrize(
    "tokenizer, task, eval_batches",
    [("bpe", "clm", None), ("wordpiece", "clm", None), ("hf", "mlm", None), ("bpe", "clm", 2)],
)
def test_bits_per_byte_of_a_run_is_nats_times_tokens_over_bytes_ln2(
    tokenizer, task, eval_batches, tmp_path, train_tiny_shared, monkeypatch
):
    """A few training steps with each tokenizer (hf: a saved folder, whole-word MLM); the logged bits/byte is the
    validation loss × the scored windows' tokens / (the bytes they cover × ln 2): the whole split's, or under
    data.eval_batches its first eval_batches × batch × seq_len tokens."""
    from harness.data.corpus import TextFiles

    monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")
    (tmp_path / "corpus.txt").write_bytes(make_text(30_000, seed=1))
    corpus = TextFiles(str(tmp_path / "corpus.txt")).load()
    if tokenizer == "hf":
        folder = saved_hf(tmp_path, corpus, "wordpiece", pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]")
        chosen, tok = ["tokenizer=hf", f"tokenizer.name={folder}", "task.whole_word=true"], Pretrained(folder)
    else:
        chosen, tok = (
            [f"tokenizer={tokenizer}", "tokenizer.vocab_size=300"],
            (BPE if tokenizer == "bpe" else WordPiece)(vocab_size=300),
        )
    summary, client = train_tiny_shared(
        "data=text",
        f"data.path={tmp_path / 'corpus.txt'}",
        f"task={task}",
        *chosen,
        f"data.eval_batches={'null' if eval_batches is None else eval_batches}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
    )
    tok.fit(corpus)  # the run's vocabulary (trained ones: from the cache the run filled)
    n_tokens, n_bytes = len(tok.encode(corpus.val)), len(corpus.val)
    assert n_bytes > 1.5 * n_tokens  # subword tokens: several bytes each
    if eval_batches is not None:  # TINY: batch 8, seq_len 32; byte-level BPE decodes to the bytes it covers
        n_tokens = eval_batches * 8 * 32
        n_bytes = len(tok.decode(tok.encode(corpus.val)[:n_tokens]).encode())
        assert bytes_per_token(corpus, tok, n_tokens) == n_bytes / n_tokens != bytes_per_token(corpus, tok)
    expected = summary.val_loss * n_tokens / (n_bytes * math.log(2))
    assert summary.val_bpc == pytest.approx(expected, rel=1e-12)
    run = client.get_run(summary.run_id)
    assert run.data.metrics["val/bpc"] == pytest.approx(expected, rel=1e-6)


def test_bits_per_byte_of_the_byte_tokenizer_is_nats_over_ln2(corpus):
    assert bytes_per_token(corpus, ByteTokenizer()) == bytes_per_token(corpus, ByteTokenizer(), 100) == 1.0


@pytest.mark.parametrize("cls", [BPE, WordPiece])
def test_bytes_per_token_of_the_first_tokens_is_of_the_text_they_cover(cls, corpus, cache):
    """The first n tokens of the validation split are the encoding of its first bytes_per_token × n bytes."""
    tok = cls(vocab_size=300, min_frequency=1)
    tok.fit(corpus)
    ids = tok.encode(corpus.val)
    assert bytes_per_token(corpus, tok) == len(corpus.val) / len(ids) == bytes_per_token(corpus, tok, len(ids) + 5)
    for n in (1, 100, len(ids) // 2):
        covered = round(bytes_per_token(corpus, tok, n) * n)
        assert tok.encode(corpus.val[:covered]).tolist() == ids[:n].tolist()


def test_a_wordpiece_vocabulary_is_the_same_file_each_time_it_is_trained():
    """tokenizers' WordPiece trainer numbers the same tokens in another order run to run; posbench fixes one order
    (specials first, then by token), so two trainings on one text give one file and the same ids."""
    pytest.importorskip("tokenizers")
    from harness.data.subword import SPECIALS, train_tokenizer

    text = "\n\n".join(f"Row {i}: the {'quick' if i % 3 else 'slow'} fox, {i % 11} dogs." for i in range(3000)).encode()
    first, second = (train_tokenizer("wordpiece", text, 400, 2) for _ in range(2))
    assert first.to_str() == second.to_str()
    assert [first.token_to_id(t) for t in SPECIALS] == list(range(len(SPECIALS)))
    assert first.decode(first.encode("Row 12: the quick fox").ids) == "row 12 : the quick fox"


def test_a_cached_vocabulary_swapped_or_damaged_is_refused_and_an_unsealed_one_retrained(corpus, cache):
    """The cache keeps each vocabulary's sha256 beside it: another valid vocabulary put in its place, or a flipped
    byte, is one line naming the file; a cache written before the seal is trained again and sealed."""
    BPE(vocab_size=300).fit(corpus)
    (file,) = (cache / "tokenizers").glob("bpe-v300-*.json")
    good = file.read_bytes()
    BPE(vocab_size=280).fit(corpus)
    file.write_bytes(next((cache / "tokenizers").glob("bpe-v280-*.json")).read_bytes())  # valid, but another
    with pytest.raises(
        ConfigError,
        match=r"bpe-v300-.*\.json is damaged \(its sha256 .*\); the cached vocabulary was "
        r"damaged or replaced; delete it",
    ):
        BPE(vocab_size=300).fit(corpus)
    file.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(ConfigError, match="damaged or replaced"):
        BPE(vocab_size=300).fit(corpus)
    file.write_bytes(good)
    seal = file.with_name(file.name + ".sha256")
    seal.unlink()  # an older cache, unsealed: trained again, then sealed
    BPE(vocab_size=300).fit(corpus)
    assert file.read_bytes() == good and seal.read_text().strip() == hashlib.sha256(good).hexdigest()


def test_a_vocabulary_the_text_cannot_fill_gives_the_model_its_own_size(corpus, cache, capsys):
    """tokenizer.vocab_size=50257 on a small text trains fewer ids (no more merges occur in it): the model gets the
    trained size, so no embedding row is for an id that can never occur; the run says so, a paper's size must be met,
    and the recipe keeps what was asked (the cache and a prepared folder are keyed by it)."""
    from types import SimpleNamespace

    from harness.train import _check_trained_vocabulary

    tok = BPE(vocab_size=50257)
    tok.fit(corpus)
    trained = tok.tokenizer.get_vocab_size(with_added_tokens=True)
    assert trained < 50257 and tok.vocab_size == trained and tok.recipe()["vocab_size"] == 50257
    spec = SimpleNamespace(run=SimpleNamespace(paper=None))
    _check_trained_vocabulary(spec, 50257, trained)  # the model is sized by tok.vocab_size, asserted above
    assert capsys.readouterr().err.strip() == (
        f"tokenizer: the training split gives {trained:,} ids of tokenizer.vocab_size=50,257 (no more merges occur in "
        f"it); the model has {trained:,} embedding rows"
    )
    with pytest.raises(
        ConfigError, match=f"the paper's model with 50,257 token ids, and this corpus trains {trained:,}"
    ):
        _check_trained_vocabulary(SimpleNamespace(run=SimpleNamespace(paper={"vocab_size": 50257})), 50257, trained)


def test_a_wordpiece_alphabet_larger_than_the_vocabulary_asked_is_refused(cache):
    """WordPiece keeps every character of the training split whatever tokenizer.vocab_size says: a text of 600
    distinct characters trains more than 300 ids, which a model of 300 embedding rows cannot take; refused with the
    size that fits, which then trains every id below it."""
    rng = random.Random(0)
    chars = [chr(0x4E00 + i) for i in range(600)]
    text = "\n".join(" ".join("".join(rng.choice(chars) for _ in range(3)) for _ in range(8)) for _ in range(2000))
    data = text.encode()
    corpus = Corpus("cjk", *block_split(data, 20), hashlib.sha256(data).hexdigest(), len(data))
    with pytest.raises(ConfigError, match=r"raise tokenizer.vocab_size to at least \d") as e:
        WordPiece(vocab_size=300).fit(corpus)
    needed = int(str(e.value).rsplit(" ", 1)[1].replace(",", ""))
    assert needed > 300 and "\n" not in str(e.value)
    tok = WordPiece(vocab_size=needed)
    tok.fit(corpus)
    assert tok.vocab_size == needed and int(tok.encode(corpus.val).max()) < needed
    assert int(tok.regular_ids().max()) < needed


@pytest.mark.parametrize("kind", ["byte", "bpe", "wordpiece"])
def test_an_exported_tokenizer_loads_with_autotokenizer_and_encodes_as_the_run_did(kind, corpus, cache, tmp_path):
    """export=hf writes the run's tokenizer (harness/pretrained/export.py): transformers' AutoTokenizer loads the
    folder and gives the ids the model trained on, text with multi-byte characters, tabs and blank lines included,
    and names the vocabulary's pad and mask tokens."""
    from transformers import AutoTokenizer

    from harness.pretrained.export import tokenizer_files

    tok = {"byte": ByteTokenizer, "bpe": lambda: BPE(vocab_size=300, min_frequency=1), "wordpiece": WordPiece}[kind]()
    tok.fit(corpus)
    for name, text in tokenizer_files(tok, 128).items():
        (tmp_path / name).write_text(str(text))
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    texts = [corpus.val.decode()[:4000], "Zürich\tnaïve — 漢字 €5\n\n  two  spaces\nend", "", "a [MASK] [PAD] b"]
    for text in texts:
        ours = tok.encode(text.encode()).tolist()
        assert loaded.encode(text, add_special_tokens=False) == ours
        assert loaded.decode(ours, skip_special_tokens=True) == tok.decode(ours)
    assert (loaded.pad_token_id, loaded.mask_token_id) == (tok.pad_id, tok.mask_id)
    assert loaded.model_max_length == 128
