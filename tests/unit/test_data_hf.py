"""data=hf: Hugging Face datasets saved locally (save_to_disk, parquet, json) read as the text they hold,
trained from, streamed; bad input refused with one line before training. Offline: nothing leaves the machine."""

from __future__ import annotations

import hashlib

import pytest

datasets = pytest.importorskip("datasets")

from harness.data.corpus import block_split  # noqa: E402
from harness.data.hf import HFDataset  # noqa: E402
from harness.errors import ConfigError  # noqa: E402
from tests.helpers import validated  # noqa: E402

ROWS = [f"Row {i}: the {'quick' if i % 3 else 'slow'} brown fox jumps over {i % 7} lazy dogs." for i in range(1600)]
TEXT = "\n\n".join(ROWS).encode()  # rows joined by blank lines


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One dataset (a text column and an int column) saved in each local form datasets reads."""
    root = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset.from_dict({"text": ROWS, "n": list(range(len(ROWS)))})
    ds.save_to_disk(str(root / "disk"))
    (root / "parquet").mkdir()
    ds.select(range(800)).to_parquet(str(root / "parquet" / "a.parquet"))  # two files, read in name order
    ds.select(range(800, 1600)).to_parquet(str(root / "parquet" / "b.parquet"))
    ds.to_json(str(root / "rows.jsonl"))
    datasets.DatasetDict(train=ds, validation=ds.select(range(40))).save_to_disk(str(root / "dict"))
    (root / "named").mkdir()  # files named by split, as the Hub names them
    ds.to_parquet(str(root / "named" / "train-00000-of-00001.parquet"))
    ds.select(range(40)).to_parquet(str(root / "named" / "validation.parquet"))
    for split, rows in (("train", range(1600)), ("validation", range(40))):  # or folders named by split
        (root / "folders" / split).mkdir(parents=True)
        ds.select(rows).to_json(str(root / "folders" / split / "part.jsonl"))
    return root


@pytest.mark.parametrize("form", ["disk", "parquet", "rows.jsonl"])
@pytest.mark.parametrize("streaming", [False, True])
def test_each_local_form_reads_the_rows_text(saved, form, streaming):
    corpus = HFDataset(path=str(saved / form), streaming=streaming, val_by="block").load()
    assert (corpus.train, corpus.val) == block_split(TEXT, 20) and corpus.size == len(TEXT)


@pytest.mark.parametrize("streaming", [False, True])
def test_without_a_validation_split_every_20th_row_is_validation_whole(saved, streaming):
    """data.val_by=document (the default): rows 19, 39, … to validation, each whole, the others to training;
    no row is cut between the two (a 4 KiB block split cuts one at nearly every block edge), and the corpus
    hash is the whole text's, as before."""
    corpus = HFDataset(path=str(saved / "disk"), streaming=streaming).load()
    val_rows = [r for i, r in enumerate(ROWS) if i % 20 == 19]
    assert corpus.val == "\n\n".join(val_rows).encode() and len(val_rows) == 80
    assert corpus.train == "\n\n".join(r for i, r in enumerate(ROWS) if i % 20 != 19).encode()
    assert corpus.sha256 == hashlib.sha256(TEXT).hexdigest() and corpus.size == len(TEXT)
    train_rows = set(corpus.train.decode().split("\n\n"))
    assert all(r not in train_rows for r in corpus.val.decode().split("\n\n"))  # every document on one side
    block_train, block_val = block_split(TEXT, 20)
    cut = [
        r for r in ROWS if r.encode() not in block_train.split(b"\n\n") and r.encode() not in block_val.split(b"\n\n")
    ]
    assert len(cut) == 2  # the block split of the same rows: its one validation block cuts a row at each edge


def test_a_document_split_that_leaves_a_side_empty_is_one_line(tmp_path):
    datasets.Dataset.from_dict({"text": ["x" * 5000] * 10}).save_to_disk(str(tmp_path / "few"))
    with pytest.raises(
        ConfigError,
        match=r"few has 10 rows: every data.source.val_every=20-th row whole to "
        r"validation leaves validation empty; give more rows",
    ):
        HFDataset(path=str(tmp_path / "few")).load()
    assert HFDataset(path=str(tmp_path / "few"), val_every=5).load().val == b"\n\n".join([b"x" * 5000] * 2)
    with pytest.raises(ConfigError, match=r"data.val_by='rows': use document"):
        HFDataset(path=str(tmp_path / "few"), val_by="rows")


def test_named_validation_split_and_max_bytes(saved):
    corpus = HFDataset(path=str(saved / "dict"), val_split="validation").load()
    assert corpus.train == TEXT and corpus.val == "\n\n".join(ROWS[:40]).encode()
    head = HFDataset(path=str(saved / "disk"), streaming=True, max_bytes=5000, val_by="block").load()
    assert head.size == 5000 and TEXT.startswith(head.train[:4096])  # a prefix of the stream, nothing more read
    rows = HFDataset(path=str(saved / "disk"), streaming=True, max_bytes=5000).load()  # whole rows: the same bytes
    assert rows.size == 5000 and rows.train.startswith("\n\n".join(ROWS[:19]).encode())


@pytest.mark.parametrize("form", ["named", "folders"])
def test_local_files_named_by_split_carry_a_validation_split(saved, form):
    """train.parquet + validation.parquet (or train/ and validation/ folders): data.val_split=validation reads the
    validation files, the training split holds only the training files; without val_split, blocks of train."""
    corpus = HFDataset(path=str(saved / form), val_split="validation").load()
    assert corpus.train == TEXT and corpus.val == "\n\n".join(ROWS[:40]).encode()
    assert HFDataset(path=str(saved / form), val_by="block").load().train == block_split(TEXT, 20)[0]


def test_split_names_are_read_from_file_and_folder_names(tmp_path):
    from harness.data.hf import split_files

    files = [
        tmp_path / n
        for n in (
            "train-00000-of-00002.parquet",
            "train-00001-of-00002.parquet",
            "validation.parquet",
            "test_a.parquet",
        )
    ]
    assert split_files(files, tmp_path, "d") == {"train": files[:2], "validation": [files[2]], "test": [files[3]]}
    plain = [tmp_path / "a.parquet", tmp_path / "training.parquet", tmp_path / "testing.parquet"]
    assert split_files(plain, tmp_path, "d") == {"train": plain}  # "training" is no split name
    with pytest.raises(
        ConfigError,
        match="data.path=d: a.parquet names no split while other files do "
        r"\(train\); name it by its split",
    ):
        split_files([tmp_path / "train.parquet", tmp_path / "a.parquet"], tmp_path, "d")


@pytest.mark.parametrize("form", ["disk", "parquet", "rows.jsonl"])
def test_train_a_few_steps_from_each_form(saved, form, train_tiny_shared):
    summary, client = train_tiny_shared(
        "data=hf", f"data.path={saved / form}", "trainer.max_steps=2", "trainer.val_check_interval=2"
    )
    run = client.get_run(summary.run_id)
    assert run.data.tags["corpus_sha256"] == hashlib.sha256(TEXT).hexdigest()  # the exact text of the rows
    assert run.data.params["corpus.bytes"] == str(len(TEXT)) and summary.step == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data=hf"], "data=hf needs one of data.name=HUB_NAME (with a network) or data.path="),
        (["data=hf", "data.path={root}/missing"], "data.path={root}/missing does not exist"),
        (
            ["data=hf", "data.path={root}/disk", "data.text_column=body"],
            "data.text_column='body' is not a column of disk (split train); its columns are text, n",
        ),
        (["data=hf", "data.path={root}/disk", "data.text_column=n"], "holds int values (row 0), not text"),
        (["data=hf", "data.path={root}/dict", "data.split=test"], "data.split=test is not a split of"),
        (["data=hf", "data.path={root}/disk", "data.max_bytes=10"], "data.max_bytes=10 must be ≥ 4096"),
        (
            ["data=hf", "data.path={root}/named", "data.val_split=dev"],
            "data.val_split=dev is not a split of {root}/named; its files name train, validation",
        ),
        (
            ["data=hf", "data.path={root}/parquet", "data.val_split=validation"],
            "is plain data files, one split: drop data.val_split=validation",
        ),
        (["+data.text_column=body"], "data=embedded does not read data.text_column"),
        (["data=hf", "data.path={root}/disk", "data.val_by=rows"], "data.val_by='rows': use document"),
        (
            ["data=hf", "data.path={root}/disk", "data.source.val_every=5000"],
            "has 1600 rows: every data.source.val_every=5000-th row whole to validation leaves validation empty",
        ),
    ],
)
def test_bad_input_is_one_line_before_training(saved, overrides, message):
    with pytest.raises(ConfigError) as e:
        validated(*(o.format(root=saved) for o in overrides))
    assert message.format(root=saved) in str(e.value) and "\n" not in str(e.value)


def offline(monkeypatch, **env: str) -> None:
    """The Hub unreachable (``HF_ENDPOINT`` a refused port) or switched off (``HF_HUB_OFFLINE=1``), for this test
    only: harness/data/hf.py puts the process offline, in its environment and the libraries' constants."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE", "0"))
    monkeypatch.setenv("HF_ENDPOINT", env.get("HF_ENDPOINT", "http://127.0.0.1:9"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE") == "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", env.get("HF_HUB_OFFLINE") == "1")


@pytest.mark.parametrize(
    "env, why", [({}, r"http://127.0.0.1:9 cannot be reached"), ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set")]
)
def test_a_hub_name_without_network_names_the_fix_at_once(monkeypatch, env, why):
    """No network is found in one connection attempt, not by waiting on the libraries' retries."""
    from tests.helpers import connections

    offline(monkeypatch, **env)
    tried = connections(monkeypatch)
    with pytest.raises(
        ConfigError,
        match=r"data.name=posbench-no-such/corpus: not in the datasets cache, and the Hub "
        rf"was not asked \({why}.*save_to_disk\(DIR\) and set data.path=DIR",
    ):
        validated("data=hf", "data.name=posbench-no-such/corpus")
    assert len(tried) <= (0 if env else 1), tried


@pytest.mark.parametrize(
    "builder_error, key",
    [(None, "data.split"), (ValueError("no such config"), "data.config"), (ConnectionError("offline"), "data.name")],
)
def test_a_hub_datasets_value_error_is_told_by_what_its_builder_opens_not_by_its_words(monkeypatch, builder_error, key):
    """load_dataset's ValueError for an unknown split and for an unknown config read alike: which key to fix is
    asked of the library (does the builder open with this config?), never matched in its message."""
    import types

    import harness.data.hf as hf

    def load_dataset(*args, **kwargs):
        raise ValueError("Unknown thing \"x\". Should be one of ['train'].")

    def load_dataset_builder(name, config):
        if builder_error is not None:
            raise builder_error

    monkeypatch.setattr(
        hf,
        "_datasets",
        lambda: types.SimpleNamespace(load_dataset=load_dataset, load_dataset_builder=load_dataset_builder),
    )
    with pytest.raises(ConfigError, match=rf"^{key}: Unknown thing \"x\"\. Should be one of \['train'\]\.$"):
        HFDataset(name="someone/corpus", config="en").open("x")
