"""Integrity: each file and record posbench writes and later reads back carries the sha256 it was written with,
and a read that finds other bytes is refused in one line naming the file and the fix. The one module that
computes and checks digests; every writer and reader calls it.

Four things are sealed, one way each, and the comparison is one function (``check_digest``):

- **a JSON record** (a run link ``run.json``, a sweep's ``mlflow_sweep.json``, ``best.json``, a shard folder's
  ``manifest.json``): its own ``sha256`` key over its canonical JSON (sorted keys, no spaces) — ``write``, ``read``
  (``read_fields``: a dataclass's fields, as the run link and the sweep's record are);
- **a file** (a corpus cache, a vocabulary, a checkpoint, an exported model, a run's artifact): ``<name>.sha256``
  beside it, its digest and a newline — ``write_bytes``, ``seal_file``, ``sealed_files``, ``check_file``; ``cached``
  for a file built once per machine and then read;
- **a report folder**: ``SHA256SUMS`` in coreutils' format (``sha256sum -c SHA256SUMS`` checks it without
  posbench) — ``report_folder``, ``seal_report``, ``check_report``;
- **a run's record in the tracking store** (sqlite checks its pages, not the values in them): tag ``posbench.seal``,
  digests of the run's status, params, tags, latest metrics and each metric's history, written when the run closes
  — ``seal``; ``SealedClient`` checks every run and history it returns (``RecordDamaged``).

Writes are atomic (a temporary file renamed over the old one), so a reader never meets half a file, and a folder
a command will write is tried first (``check_writable_dir``), so a refusal comes before the work. A key one
character off a seal's (``sha257``: a flipped bit) is the seal damaged (``_near_miss``).

Without a seal: a record, file or report folder that carries none was written before posbench sealed it (or its
write stopped between the file and its seal); it is read as it is (``read``, ``intact``), reported as unsealed
(``check_file`` and ``check_report`` return False: a cache rebuilds it, a model folder is said to be unverified),
and a report counts such runs (``unsealed``). This paragraph is the one place that decides it.

Not sealed: a run's name and description (``mlflow.runName``, ``mlflow.note.content``: the dashboard edits them).
A run written again after it closed (resumed: its seal is dropped when it reopens; adopted by a sweep: sealed again
after its new tags) carries the seal of its last write.

Ground: imports nothing from the project but its errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.errors import ConfigError, one_line

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SEAL = "sha256"
R = TypeVar("R", bound="DataclassInstance")  # a record ``read_fields`` builds


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _canonical(value: Any) -> str:
    """``value``'s JSON with sorted keys and no spaces: the text a record's digest is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


class Tally:
    """A running sha256 and byte count."""

    def __init__(self) -> None:
        self.sha256, self.bytes = hashlib.sha256(), 0

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        self.bytes += len(data)


def _replace(path: Path, data: str | bytes, tmp: Path | None = None) -> None:
    """``data`` to ``path`` whole or not at all: written to ``tmp`` (beside it) and renamed over it."""
    tmp = tmp or path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    tmp.replace(path)


def check_digest(path: Path, recorded: str, where: str, fix: str) -> None:
    """The one comparison: ``path``'s bytes hash to ``recorded`` (which ``where`` holds: "its .sha256 holds", "its
    SHA256SUMS lists", "manifest.json records"), else a ConfigError naming the file and ``fix`` (a flipped byte, a
    truncation, another file put in its place)."""
    if not path.is_file():
        raise ConfigError(f"{path} is missing ({where} its digest); {fix}")
    actual = file_digest(path)
    if actual != recorded:
        raise ConfigError(f"{path} is damaged (its sha256 {actual[:12]}… is not the {recorded[:12]}… {where}); {fix}")


# ---------------------------------------------------------------- a JSON record, sealed by its own key


def digest(record: dict, key: str = SEAL) -> str:
    return sha256(_canonical({k: v for k, v in record.items() if k != key}))


def write(path: Path, record: dict) -> None:
    """``record`` and its seal to ``path``, atomically."""
    _replace(path, json.dumps({**record, SEAL: digest(record)}, indent=1))


def read(path: Path, fix: str, keys: Collection[str] = ()) -> dict:
    """The record at ``path`` without its seal; a ConfigError naming the file and ``fix`` if it is damaged.
    ``keys``: the record's fields, when known: another key (a damaged seal's name, ``sha257``) is damage, not a
    record from before seals."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is damaged (not JSON: {one_line(e)[:60]}); {fix}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path} is damaged (not a JSON object); {fix}")
    near = [] if SEAL in record else [k for k in record if _near_miss([k], SEAL)]
    if near:
        raise ConfigError(f"{path} is damaged (its seal's key reads {near[0]!r}); {fix}")
    if not intact(record):
        raise ConfigError(f"{path} is damaged (its content no longer matches its sha256); {fix}")
    unknown = sorted(set(record) - {SEAL} - set(keys)) if keys else []
    if unknown:
        raise ConfigError(f"{path} is damaged (keys {unknown} are none of its fields); {fix}")
    return {k: v for k, v in record.items() if k != SEAL}


def read_fields(path: Path, record_type: type[R], fix: str) -> R | None:
    """The dataclass ``record_type`` that ``write(path, asdict(...))`` sealed, or None when ``path`` does not exist;
    a ConfigError naming the file and ``fix`` if it is damaged. Each field is read as text, or as a list of texts
    where the dataclass declares ``list[str]`` (a record from before seals may hold other JSON there): a field
    missing, or a number where a list belongs, is damage."""
    if not path.exists():
        return None
    declared = {f.name: str(f.type) for f in dataclasses.fields(record_type)}  # "list[str]": as written, or its repr
    record = read(path, fix, keys=declared)
    try:
        return record_type(
            **{
                name: [str(v) for v in record[name]] if annotation == "list[str]" else str(record[name])
                for name, annotation in declared.items()
            }
        )
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{path} is damaged ({type(e).__name__}: {e}); {fix}") from None


def intact(record: dict) -> bool:
    """Whether a record read from JSON still matches its seal (one from before seals has none: True; a key one
    character off the seal's, ``sha2V6``, is the seal damaged, not a record from before seals)."""
    if SEAL not in record:
        return not _near_miss(record, SEAL)
    return record[SEAL] == digest(record)


def _near_miss(keys: Iterable[str], name: str) -> bool:
    """Whether a key among ``keys`` is ``name`` with one character changed (a flipped bit in a seal's key)."""
    return any(len(k) == len(name) and sum(a != b for a, b in zip(k, name, strict=True)) == 1 for k in keys)


# ---------------------------------------------------------------- files sealed beside themselves

FILE_SEAL = ".sha256"


def seal_path(path: Path) -> Path:
    return path.with_name(path.name + FILE_SEAL)


def sealed_files(files: dict[str, str | bytes]) -> dict[str, str | bytes]:
    """``files`` (name -> content, as a run's artifacts are logged) with each one's ``<name>.sha256`` beside it."""
    return {**files, **{f"{name}{FILE_SEAL}": sha256(data) + "\n" for name, data in files.items()}}


def seal_file(path: Path) -> None:
    """``<path>.sha256`` for the file at ``path`` as it is now, written whole or not at all."""
    _replace(seal_path(path), file_digest(path) + "\n")


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` to ``path`` atomically, then its seal (a crash between leaves a file without one: unsealed)."""
    _replace(path, data)
    seal_file(path)


def cached(path: Path, build: Callable[[], bytes], fix: str | None = None) -> Path:
    """``path``, written from ``build()`` once per machine (``write_bytes``: concurrent runs never read half). A cache
    from before seals is built again; one whose bytes changed since is refused with ``fix`` before a run reads it (it
    would run on other data)."""
    if not (
        path.exists() and check_file(path, fix or f"delete {path} and its .sha256, and the next run builds it again")
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, build())
    return path


def check_file(path: Path, fix: str) -> bool:
    """Whether ``path`` is sealed (False: no ``.sha256`` beside it); a ConfigError naming it and ``fix`` when its
    bytes are not those sealed (a flipped byte, a truncation, another file put in its place)."""
    seal = seal_path(path)
    # a seal is exactly its digest and a newline, as its writer wrote it: any flipped bit of it refuses the file it
    # seals (a byte that is no UTF-8 reads as a character that matches no digest)
    try:
        written = seal.read_bytes().decode("utf-8", errors="replace").removesuffix("\n")
    except FileNotFoundError:
        return False
    except OSError as e:
        raise ConfigError(f"{seal} cannot be read ({type(e).__name__}); {fix}") from None
    check_digest(path, written, f"its {FILE_SEAL} holds", fix)
    return True


# ---------------------------------------------------------------- a report folder, sealed as a whole

SUMS = "SHA256SUMS"  # coreutils' format: ``sha256sum -c SHA256SUMS`` checks a report without posbench


@contextlib.contextmanager
def report_folder(out: Path) -> Iterator[Path]:
    """A report folder written whole or not at all. The command writes its files into the yielded staging folder
    (beside ``out``, on its file system); when the block ends they replace ``out``'s files of the same names and
    ``SHA256SUMS`` lists exactly them, written last. If the block fails (a full disk mid-PNG, Ctrl-C) the staging
    folder is removed and ``out`` is as it was. A file in ``out`` the command did not write (a stale README.md of
    something else) stays where it is, unsealed."""
    import shutil

    out = out.expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging
        names = seal_report(staging)
        out.mkdir(exist_ok=True)
        for name in [*names, SUMS]:  # renames within one file system: nothing more to write, so nothing can fail
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def seal_report(folder: Path) -> list[str]:
    """``folder/SHA256SUMS``: the sha256 of each file in the report folder ``folder`` (not itself, nor hidden
    ones), one ``<hex>  <name>`` line each, written whole or not at all; the names it lists. ``report_folder`` calls
    it on its staging folder; a command that adds to a folder over several runs (the GPU benchmark) calls it last."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != SUMS and not p.name.startswith("."))
    sums = "".join(f"{file_digest(folder / name)}  {name}\n" for name in names)
    _replace(folder / SUMS, sums, folder / f".{SUMS}.tmp{os.getpid()}")  # hidden: not a file of the report
    return names


def check_report(folder: Path, fix: str, needs: Iterable[str] = ()) -> bool:
    """Whether report folder ``folder`` is sealed (False: no SHA256SUMS, a report from before seals); a ConfigError
    naming the file and ``fix`` when a file it lists is missing or its bytes differ, a line is not one sha256sum
    writes, or a file in ``needs`` (what the reader is about to read) is not listed."""
    sums = folder / SUMS
    try:
        lines = sums.read_text().splitlines()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{sums} cannot be read ({type(e).__name__}); {fix}") from None
    listed = {}
    for number, line in enumerate(lines, 1):
        hexdigest, sep, name = line.partition("  ")
        if not sep or len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest) or "/" in name:
            raise ConfigError(
                f"{sums} is damaged (line {number} is not a sha256sum line: 64 hex digits, two spaces, "
                f"a file name); {fix}"
            )
        listed[name] = hexdigest
    for name in needs:
        if name not in listed:
            raise ConfigError(f"{folder / name} is not in {sums}: it was written after the report was sealed; {fix}")
    for name, hexdigest in listed.items():
        check_digest(folder / name, hexdigest, f"its {SUMS} lists", fix)
    return True


# ---------------------------------------------------------------- a run's record in the tracking store

SEAL_TAG = "posbench.seal"
MARK_TAG = "posbench.sealed_when_closed"  # set when posbench creates a run: closed without a seal, it was damaged
CLOSED = ("FINISHED", "FAILED", "KILLED")
UNSEALED = ("mlflow.runName", "mlflow.note.content", SEAL_TAG)  # a user may edit these in the dashboard
MAX_SEAL_CHARS = 7500  # under MLflow's 8,000 per tag value; past it, one digest over every history


class RecordDamaged(ConfigError):
    """A run's record in the store differs from its seal; ``str`` is the one line."""

    def __init__(self, line: str, run_id: str = ""):
        super().__init__(line)
        self.run_id = run_id


_WARNED: set[str] = set()  # runs a warning has named in this process: a sweep's cell meets one twice (adopt, resume)


def warn(damaged: RecordDamaged, then: str) -> None:
    """``warning: <the line>; <then>`` on stderr, once per run and process (where a sweep goes on without it)."""
    if damaged.run_id not in _WARNED:
        _WARNED.add(damaged.run_id)
        print(f"warning: {damaged}; {then}", file=sys.stderr)


def seal(client: Any, run_id: str) -> None:
    """Write the seal of run ``run_id`` as the store holds it now (after its last write)."""
    raw = getattr(client, "raw", client)  # the record as it is: it may differ from an older seal (adoption)
    run = raw.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if k not in UNSEALED}
    body = {
        "v": 1,
        "status": run.info.status,
        "params": _digest(run.data.params),
        "tags": sorted(tags),
        "tag_values": _digest(tags),
        "latest": _digest(_floats(run.data.metrics)),
        "history": {key: _history(raw.get_metric_history(run_id, key)) for key in sorted(run.data.metrics)},
    }
    text = _canonical(body)
    if len(text) > MAX_SEAL_CHARS:
        body["history"] = _digest(body["history"])
        text = _canonical(body)
    raw.set_tag(run_id, SEAL_TAG, text)


def _digest(value) -> str:
    return sha256(_canonical(value))[:16]


def _floats(metrics: dict[str, float]) -> dict[str, str]:
    return {k: repr(float(v)) for k, v in metrics.items()}  # repr: exact, and NaN/inf as text


def _history(points) -> str:
    return _digest(sorted([m.step, m.timestamp, repr(float(m.value))] for m in points))


def _seal_of(run) -> dict | None:
    """The run's seal, or None (a run from before seals, or not yet closed); a run posbench created (``MARK_TAG``)
    that is closed without one was damaged."""
    tags = run.data.tags
    text = tags.get(SEAL_TAG)
    if text is None:
        near = next((k for k in tags if _near_miss([k], SEAL_TAG)), None)
        if near is not None:
            raise _damaged(run, f"its seal's key reads {near!r}")
        if MARK_TAG in tags and run.info.status in CLOSED:
            raise _damaged(run, "its seal is gone (posbench seals every run it closes)")
        return None
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or body.get("v") != 1:
            raise ValueError
        return body
    except ValueError:
        raise _damaged(run, "its seal is unreadable") from None


def check_run(run) -> None:
    """``run``'s status, params, tags and latest metrics against its seal."""
    body = _seal_of(run)
    if body is None:
        return
    tags = run.data.tags
    missing = [k for k in body["tags"] if k not in tags]
    changed = ([f"tag {missing[0]!r} is gone"] if missing else []) + [
        what
        for what, ok in (
            ("its status", run.info.status == body["status"]),
            ("a param", _digest(run.data.params) == body["params"]),
            ("a tag", missing or _digest({k: tags[k] for k in body["tags"]}) == body["tag_values"]),
            ("a metric's latest value", _digest(_floats(run.data.metrics)) == body["latest"]),
        )
        if not ok
    ]
    if changed:
        raise _damaged(run, f"{changed[0]} differs from its seal")


def unsealed(runs) -> list[str]:
    """The ids of closed runs among ``runs`` that carry no seal: closed before posbench sealed run records, so their
    values are read unchecked (a report says how many)."""
    return [r.info.run_id for r in runs if r.info.status in CLOSED and SEAL_TAG not in r.data.tags]


def _check_history(run, key: str, points: list, histories: Callable[[], dict[str, list]]) -> dict[str, str]:
    """Metric ``key``'s history of ``run`` against its seal; ``histories()`` gives every key's, for a seal that
    holds one digest over all (a run with more metrics than a tag holds digests of). Returns the digest of each
    history found intact (so a caller checks one of them again without reading all)."""
    body = _seal_of(run)
    if body is None:
        return {}
    sealed = body["history"]
    if isinstance(sealed, str):
        each = {k: _history(p) for k, p in sorted(histories().items())}
        sealed = each if _digest(each) == sealed else {}
    if not (key not in run.data.metrics and key not in sealed or sealed.get(key) == _history(points)):
        raise _damaged(run, f"metric {key!r}'s history differs from its seal")
    return sealed


def _damaged(run, what: str) -> RecordDamaged:
    name = run.data.tags.get("mlflow.runName", "")
    return RecordDamaged(
        f"run {run.info.run_id}{f' ({name})' if name else ''} in the tracking store is damaged: {what}, written "
        "when the run closed (a changed byte, or an edit outside posbench); restore the store from a copy, or delete "
        "that run in the dashboard and run its command again",
        run.info.run_id,
    )


class SealedClient:
    """The store's client (``raw``), every run and history it reads checked against its seal."""

    def __init__(self, raw: Any):
        self.raw = raw
        self._intact: dict[tuple[str, str], dict[str, str]] = {}  # (run, its seal) -> each history's digest

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "raw":  # unpickling looks these up before ``raw`` exists
            raise AttributeError(name)
        return getattr(self.raw, name)

    def get_run(self, run_id: str):
        run = self.raw.get_run(run_id)
        check_run(run)
        return run

    def search_runs(self, *args, **kwargs):
        runs = self.raw.search_runs(*args, **kwargs)
        for run in runs:
            check_run(run)
        return runs

    def get_metric_history(self, run_id: str, key: str) -> list:
        points = self.raw.get_metric_history(run_id, key)
        run = self.raw.get_run(run_id)
        sealed_as = (run_id, run.data.tags.get(SEAL_TAG, ""))
        if self._intact.get(sealed_as, {}).get(key) != _history(points):
            self._intact[sealed_as] = _check_history(
                run, key, points, lambda: {k: self.raw.get_metric_history(run_id, k) for k in run.data.metrics}
            )
        return points


def check_writable_dir(path: Path, key: str, fix: str) -> None:
    """``path`` can be made (where missing) and written, which the check tries in a scratch folder of a unique name
    in its deepest existing folder, removed again: it creates nothing under the path's own name (a refused run
    leaves no folder; two commands checking one folder at once never see each other's probe), and ``/proc/x``,
    which passes a permission test, fails as its first write would."""
    existing, missing, is_dir = _deepest_existing(path)
    if not is_dir:
        raise ConfigError(f"{key}: cannot create {path} ({existing} is not a directory); {fix}")
    try:
        with tempfile.TemporaryDirectory(
            prefix=".posbench-write-test-", dir=existing, ignore_cleanup_errors=True
        ) as scratch:
            # the missing part of the path, made under the scratch folder: a name the file system refuses shows
            probe = Path(scratch).joinpath(*missing)
            probe.mkdir(parents=True, exist_ok=True)
            (probe / "probe").write_bytes(b"")
    except OSError as e:
        raise ConfigError(f"{key}: cannot write {path} ({e.strerror}); {fix}") from None


def _deepest_existing(path: Path) -> tuple[Path, tuple[str, ...], bool]:
    """The deepest ancestor of ``path`` (itself included) that exists, the names below it that do not, and
    whether it is a folder: one ``stat`` per level, so a folder removed between two looks reads as missing,
    never as a file."""
    for depth, p in enumerate((path, *path.parents)):
        try:
            mode = p.stat().st_mode
        except OSError:  # missing, below a file, a name too long: found higher up, refused by the probe
            continue
        return p, path.parts[len(path.parts) - depth :], stat.S_ISDIR(mode)
    raise AssertionError("the root always exists")
