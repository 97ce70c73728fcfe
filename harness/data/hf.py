"""Hugging Face ``datasets`` as a corpus: ``data=hf`` (conf/data/hf.yaml).

One text column of a dataset becomes the corpus's text, rows joined by blank lines (as ``TextFiles`` joins
files). The dataset comes from the Hub by name (``data.name``, ``data.config``, ``data.split``: needs a network
or the datasets cache) or from a local path (``data.path``): a ``save_to_disk`` folder, or ``.parquet``,
``.json``/``.jsonl``, ``.csv``, ``.txt`` files (one file, or every such file under a folder, sorted).

Validation is the ``data.val_split`` split when it is named (e.g. ``validation``: a split of a save_to_disk folder or
of the Hub, or the local files named by it, ``split_files``), else every ``data.source.val_every``-th row of the
training split, whole (``data.val_by=document``: a document is never cut between the two sides, so no validation
text was half seen in training), or every ``data.source.val_every``-th 4 KiB block of the training text
(``data.val_by=block``, ``block_split``'s rule, by which the other sources, whose documents are not rows, split);
``HFDataset.sides`` cuts them, for a run and for ``posbench prepare`` alike.

``data.streaming=true`` reads rows lazily (``datasets``' streaming mode: a hub corpus is not downloaded
whole) and stops at ``data.max_bytes`` of text per split; a corpus larger than memory is tokenized once into
memory-mapped shards by ``posbench prepare`` (which streams rows the same way) and trained
from with ``data=tokens``.

``datasets`` is imported only when a dataset is opened (it takes about a second).

Whether the Hub may be asked (``hub_offline``), for a dataset here and a tokenizer (harness/data/subword.py) alike:
with no network, ``transformers`` and ``datasets`` retry the Hub with backoff for tens of seconds before they fall
back to their caches or fail; with ``HF_HUB_OFFLINE=1`` they read the cache at once. So before the first load by
name, one TCP connection to the Hub's endpoint (``HF_ENDPOINT``, else huggingface.co) is tried for a few seconds
(harness/data/corpus.py ``unreachable``); when it fails, the process goes offline as if the user had set
``HF_HUB_OFFLINE=1``: a cached tokenizer or dataset still loads, a missing one is refused at once, and the refusal
says why the Hub was not asked.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

from harness import integrity
from harness.data.corpus import Corpus, ValEvery, unreachable
from harness.errors import ConfigError, one_line
from harness.ranges import ranged

# file suffix -> the ``datasets`` builder that reads it
BUILDERS = {
    ".parquet": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
    ".arrow": "arrow",
}
SEPARATOR = b"\n\n"  # between rows, as TextFiles joins files
BLOCK = 4096  # block_split's blocks (harness/data/corpus.py)
VAL_BY = ("document", "block")  # data.val_by without a named validation split: whole rows, or 4 KiB blocks
TRUE = ("1", "true", "yes", "on")  # the values of HF_HUB_OFFLINE that switch the Hub off


class HFDataset:
    """A ``datasets`` dataset's ``text_column`` as a corpus. Checks run on the first ``sizes``/``load``;
    the corpus read then is kept, so validation and training read the dataset once."""

    requires = ("datasets",)  # checked before it is built (harness/extras.py): the hf extra brings it

    @ranged
    def __init__(
        self,
        path: str | None = None,
        name: str | None = None,
        config: str | None = None,
        split: str = "train",
        val_split: str | None = None,
        text_column: str = "text",
        streaming: bool = False,
        max_bytes: int | None = None,
        val_every: ValEvery = 20,
        val_by: str = "document",
    ):
        if val_by not in VAL_BY:
            raise ConfigError(
                f"data.val_by={val_by!r}: use document (every data.source.val_every-th row whole to "
                "validation) or block (every data.source.val_every-th 4 KiB block)"
            )
        if max_bytes is not None and max_bytes < 4096:
            raise ConfigError(f"data.max_bytes={max_bytes} must be ≥ 4096 (4 KiB), or null for the whole split")
        self.path, self.name, self.config, self.split, self.val_split = path, name, config, split, val_split
        self.text_column, self.streaming, self.max_bytes, self.val_every = text_column, streaming, max_bytes, val_every
        self.val_by = val_by
        self._corpus: Corpus | None = None

    # --- what the harness calls

    def sizes(self) -> tuple[int, int]:
        corpus = self.load()
        return len(corpus.train), len(corpus.val)

    def load(self) -> Corpus:
        if self._corpus is None:
            whole, sides = integrity.Tally(), {"train": bytearray(), "val": bytearray()}
            for split, data, _ in self.sides(whole):
                sides[split] += data
            if whole.bytes < 4096:
                raise ConfigError(
                    f"{self.describe()} holds {whole.bytes} bytes of text in column "
                    f"{self.text_column!r}; give at least 4 KiB"
                )
            self._corpus = Corpus(
                f"hf:{self.describe()}",
                bytes(sides["train"]),
                bytes(sides["val"]),
                whole.sha256.hexdigest(),
                whole.bytes,
            )
        return self._corpus

    def sides(self, whole: integrity.Tally) -> Iterator[tuple[str, bytes, bool]]:
        """(split, bytes, last) as the rows pass, read lazily when streaming (``load`` joins each split's, ``posbench
        prepare`` encodes them as they come): each row of the training split whole to its side, after a blank line
        when the side has one already (data.val_by=document; refused when a side gets none), or the 4 KiB blocks of
        the rows' join, every ``val_every``-th to validation (``block_split``'s rule; none when a named split is
        validation), ``last`` on the final, partial one; then the rows of a named validation split. ``whole`` is
        updated with the corpus's text: the training rows' join, then a blank line and the validation rows'."""
        by_document = not self.val_split and self.val_by == "document"  # validation: whole training rows
        val_every = sys.maxsize if self.val_split else self.val_every
        pending, n_block, rows = bytearray(), 0, {"train": 0, "val": 0}
        for i, data in enumerate(_row_pieces(self.texts(self.split), self.max_bytes)):
            whole.update(data)
            if by_document:
                side = "val" if _is_val_row(i, val_every) else "train"
                row = data[len(SEPARATOR) :] if i else data  # without the separator _row_pieces put before it
                yield side, (SEPARATOR if rows[side] else b"") + row, False
                rows[side] += 1
            else:
                pending.extend(data)
                while len(pending) >= BLOCK:
                    yield "val" if _is_val_row(n_block, val_every) else "train", bytes(pending[:BLOCK]), False
                    del pending[:BLOCK]
                    n_block += 1
        if by_document and not (rows["train"] and rows["val"]):
            raise ConfigError(
                f"{self.describe()} has {rows['train'] + rows['val']} rows: every data.source.val_every="
                f"{self.val_every}-th row whole to validation leaves "
                f"{'validation' if not rows['val'] else 'training'} empty; give more rows, a smaller "
                "data.source.val_every, data.val_by=block, or a named data.val_split"
            )
        yield "val" if _is_val_row(n_block, val_every) else "train", bytes(pending), True
        if self.val_split:
            whole.update(SEPARATOR)
            for data in _row_pieces(self.texts(self.val_split), self.max_bytes):
                whole.update(data)
                yield "val", data, False

    def describe(self) -> str:
        if self.path:
            return Path(self.path).expanduser().name
        return "/".join(p for p in (self.name, self.config) if p)

    def texts(self, split: str) -> Iterator[str]:
        """The rows' text of ``split``, in order (lazily when streaming); each checked to be a string."""
        dataset = self.open(split)
        columns = dataset.column_names  # None for some streamed datasets: checked on the first batch
        if columns is not None and self.text_column not in columns:
            raise ConfigError(
                f"data.text_column={self.text_column!r} is not a column of {self.describe()} "
                f"(split {split}); its columns are {', '.join(columns)}: set data.text_column=NAME"
            )
        row = 0
        for batch in _batches(dataset, f"{self.describe()} (split {split})"):
            if self.text_column not in batch:  # a streamed dataset may not know its columns up front
                raise ConfigError(
                    f"data.text_column={self.text_column!r} is not a column of {self.describe()} "
                    f"(split {split}); its columns are {', '.join(batch)}: set data.text_column=NAME"
                )
            for text in batch[self.text_column]:
                if text is not None and not isinstance(text, str):
                    raise ConfigError(
                        f"data.text_column={self.text_column!r} of {self.describe()} holds "
                        f"{type(text).__name__} values (row {row}), not text; name a column of strings"
                    )
                row += 1
                if text is not None:  # a missing value: no text
                    yield text

    def open(self, split: str):
        """The ``datasets`` Dataset (or IterableDataset when streaming) of ``split``."""
        if bool(self.path) == bool(self.name):
            raise ConfigError(
                "data=hf needs one of data.name=HUB_NAME (with a network) or data.path=DIR_OR_FILE "
                "(a save_to_disk folder, parquet, json or text files)" + ("; not both" if self.path else "")
            )
        if self.path:
            return self._open_local(self.path, split)
        return self._open_hub(split)

    # --- the two ways in

    def _open_hub(self, split: str):
        offline = hub_offline()  # no network: the cache at once, not a wait on retries
        datasets = _datasets()

        try:
            return datasets.load_dataset(self.name, self.config, split=split, streaming=self.streaming)
        except (ConnectionError, TimeoutError) as e:
            hub_said = (
                f"the Hub was not asked ({offline})" if offline else f"the Hub cannot be reached ({_first_line(e)})"
            )
            raise ConfigError(
                f"data.name={self.name}: not in the datasets cache, and {hub_said}; where there is a network run "
                f"datasets.load_dataset({self.name!r}"
                f"{f', {self.config!r}' if self.config else ''}).save_to_disk(DIR) and set data.path=DIR "
                "instead of data.name"
            ) from None
        except ValueError as e:  # an unknown split or config: the library names the ones there are
            raise ConfigError(f"{self._unknown_key(datasets)}: {_first_line(e)}") from None
        except FileNotFoundError as e:  # DatasetNotFoundError is one
            raise ConfigError(
                f"data.name={self.name} is not a dataset on the Hub ({_first_line(e)}); check "
                "the name, or use data.path=DIR_OR_FILE for a local one"
            ) from None

    def _unknown_key(self, datasets) -> str:
        """Which key a ValueError of ``load_dataset`` is about, asked of the library rather than read from its text:
        the dataset's builder opens with this config (then the split is what it lacks), or it does not."""
        try:
            datasets.load_dataset_builder(self.name, self.config)
        except ValueError:
            return "data.config"
        except Exception:  # the dataset itself cannot be opened here
            return "data.name"
        return "data.split"

    def _open_local(self, path: str, split: str):
        datasets = _datasets()

        root = Path(path).expanduser()
        if not root.exists():
            raise ConfigError(
                f"data.path={path} does not exist; point it at a save_to_disk folder or at "
                "parquet, json, csv or text files"
            )
        if self.name or self.config:
            raise ConfigError("data.config names a hub configuration; drop it with data.path")
        if root.is_dir() and (
            (root / "dataset_info.json").exists()
            or (root / "dataset_dict.json").exists()
            or (root / "state.json").exists()
        ):
            return self._open_saved(datasets, root, split)
        splits = split_files(self._data_files(root), root, path)
        if split not in splits:
            key = "data.val_split" if split == self.val_split else "data.split"
            if list(splits) == ["train"]:
                raise ConfigError(
                    f"data.path={path} is plain data files, one split: drop {key}={split} "
                    "(validation is then every data.source.val_every-th block), or name the files by "
                    "split (train.parquet, validation.parquet)"
                )
            raise ConfigError(
                f"{key}={split} is not a split of {path}; its files name {', '.join(splits)}: set {key} to one of them"
            )
        files = splits[split]
        builders = {BUILDERS[f.suffix.lower()] for f in files}
        if len(builders) > 1:
            raise ConfigError(
                f"data.path={path} mixes file kinds ({', '.join(sorted(builders))}); point it at files of one kind"
            )
        builder = builders.pop()
        if builder == "parquet":
            _check_schemas(files, path)
        try:
            return datasets.load_dataset(
                builder, data_files=[str(f) for f in files], split="train", streaming=self.streaming
            )
        except Exception as e:  # a malformed file: the library's reason, on one line
            raise ConfigError(
                f"data.path={path} cannot be read as {', '.join(sorted({f.suffix for f in files}))}"
                f" ({type(e).__name__}: {_first_line(e)}); fix the file or convert it"
            ) from None

    def _open_saved(self, datasets, root: Path, split: str):
        """A ``save_to_disk`` folder: a DatasetDict's split, or a single dataset (read as the training split)."""
        loaded = datasets.load_from_disk(str(root))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(
                    f"data.split={split} is not a split of {self.path}; it has "
                    f"{', '.join(loaded)}: set data.split (and data.val_split) to one of them"
                )
            loaded = loaded[split]
        elif split != "train":
            raise ConfigError(
                f"{self.path} is a single dataset (no splits): drop data.split / data.val_split "
                "(validation is then every data.source.val_every-th block)"
            )
        return loaded.to_iterable_dataset() if self.streaming else loaded

    def _data_files(self, root: Path) -> list[Path]:
        if root.is_file():
            if root.suffix.lower() not in BUILDERS:
                raise ConfigError(
                    f"data.path={root}: a {root.suffix or 'suffix-less'} file is no data file "
                    f"datasets reads here; use {', '.join(sorted(BUILDERS))}, or data=text for plain text"
                )
            return [root]
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file()
            and p.suffix.lower() in BUILDERS
            and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
        if not files:
            raise ConfigError(
                f"data.path={self.path} holds no save_to_disk dataset and no "
                f"{', '.join(sorted(BUILDERS))} files; point it at one"
            )
        return files


SPLIT_NAMES = ("train", "validation", "valid", "val", "dev", "test")


def split_files(files: list[Path], root: Path, path: str) -> dict[str, list[Path]]:
    """Local data files by split, named as the Hub names them: a file whose name, or a folder above it under
    ``root``, is a split name or starts with one and a separator (train.parquet, validation-00000-of-00001.parquet,
    test/a.jsonl). No file named so: every file is ``train``. Some named and some not: refused, naming the file."""

    def split_of(f: Path) -> str | None:
        parts = [*f.relative_to(root).parent.parts, f.stem] if root.is_dir() else [f.stem]
        return next(
            (
                name
                for part in parts
                for name in SPLIT_NAMES
                if part == name or (part.startswith(name) and part[len(name)] in "-_.")
            ),
            None,
        )

    named = {f: split_of(f) for f in files}
    if not any(named.values()):
        return {"train": files}
    unnamed = [f for f, name in named.items() if name is None]
    if unnamed:
        raise ConfigError(
            f"data.path={path}: {unnamed[0].name} names no split while other files do "
            f"({', '.join(sorted({n for n in named.values() if n}))}); name it by its split "
            "(train…, validation…) or move it out"
        )
    return {name: [f for f in files if named[f] == name] for name in dict.fromkeys(n for n in named.values() if n)}


def hub_offline() -> str | None:
    """None when the Hub may be asked; else why not (the user's ``HF_HUB_OFFLINE``, or the failed probe), after
    putting this process in Hugging Face's offline mode."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE:
        return "HF_HUB_OFFLINE is set"
    why = unreachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if why is not None:
        _go_offline()
    return why


def _go_offline() -> None:
    """``HF_HUB_OFFLINE=1`` for this process: the environment, read by the libraries when they are imported, and
    the constants of those already imported (they copied the variable at import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    for name in ("huggingface_hub.constants", "datasets.config"):  # transformers asks huggingface_hub's
        if hasattr(sys.modules.get(name), "HF_HUB_OFFLINE"):  # imported, holding its copy (not imported: None)
            vars(sys.modules[name])["HF_HUB_OFFLINE"] = True


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data=hf reads Hugging Face datasets, which is not installed: pip install datasets "
            "(or pip install -e '.[hf]')"
        ) from None
    # quiet: what goes wrong is posbench's one line, not the library's log lines and progress bars before it
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    datasets.disable_progress_bars()
    return datasets


def _batches(dataset, what: str) -> Iterator[dict]:
    """A dataset's batches; a file the library cannot read as it streams is one line (a ConfigError)."""
    try:
        yield from dataset.iter(batch_size=1024)
    except Exception as e:  # datasets' and pyarrow's own errors on a damaged or mismatched file
        raise ConfigError(
            f"{what} cannot be read ({type(e).__name__}: {_first_line(e)}); fix the file or convert it"
        ) from None


def _check_schemas(files: list[Path], path: str) -> None:
    """Parquet files of one split share their columns' names and types: datasets casts the later ones to the
    first's schema, and a mismatch (an int column where text was) stops pyarrow, sometimes the whole process.
    Read from each file's footer, not its data."""
    import pyarrow.parquet as pq

    schemas = []
    for f in files:
        try:
            schemas.append((f, pq.read_schema(f)))
        except Exception as e:  # not parquet, or damaged
            raise ConfigError(
                f"data.path={f} is not a readable parquet file ({type(e).__name__}: {_first_line(e)}); fix or remove it"
            ) from None
    (first, want), *rest = schemas
    for f, schema in rest:
        if not schema.equals(want):
            said = ", ".join(f"{n}: {t}" for n, t in zip(schema.names, schema.types, strict=True))
            wanted = ", ".join(f"{n}: {t}" for n, t in zip(want.names, want.types, strict=True))
            raise ConfigError(
                f"data.path={path}: {f.name}'s columns ({said}) differ from {first.name}'s ({wanted}); "
                "give files of one schema, or point data.path at those you want"
            )


def _row_pieces(texts: Iterator[str], max_bytes: int | None) -> Iterator[bytes]:
    """The rows joined by blank lines, one piece a row (the separator before every row but the first); at most
    ``max_bytes`` in all, the last piece cut at a character (the stream is read no further)."""
    held = 0
    for i, text in enumerate(texts):
        data = (SEPARATOR if i else b"") + text.encode("utf-8")
        if max_bytes is not None and held + len(data) >= max_bytes:
            yield data[: max_bytes - held].decode("utf-8", errors="ignore").encode("utf-8")  # less a character cut
            return
        held += len(data)
        yield data


def _is_val_row(i: int, val_every: int) -> bool:
    """Whether row ``i`` (data.val_by=document) or 4 KiB block ``i`` (data.val_by=block) goes to validation: every
    ``val_every``-th."""
    return i % val_every == val_every - 1


def _first_line(e: BaseException) -> str:
    return one_line(e)[:300]
