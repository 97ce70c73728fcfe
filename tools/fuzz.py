"""Hostile input, generated from what posbench declares rather than listed by hand, each try classified by what a
user would see. Two tables of tries, one loop:

  values   every flag of every command's parser and every leaf key of every config option (composed as
           ``posbench check`` composes it), each given the values a hostile user types (``FLAG_VALUES``,
           ``CONFIG_VALUES``: a word, a negative, zero, a huge or non-finite number, null, true, a list where a scalar
           is, paths that are a file, missing, under /proc), through the command's entry function
           (tests/inprocess.py, as the bad-input table does) in a fresh folder with a fresh store; config values
           under ``check``, so nothing trains;
  damage   one flipped bit at spread places of each file posbench writes and later reads back (``_damage_kinds``:
           shards hashed whole and block by block, their manifest and vocabulary, the caches, a checkpoint and its
           run link, a sweep's record, best.json, an export, a report folder, and the seals beside them), each copy
           read by the function the command that uses the file calls; every byte of a file under ``EVERY`` bytes.

A try ends as

  one line      exit 2 (or 1), one stderr line starting "error: ", no traceback; for damage, a one-line
                ConfigError naming the damaged file (or the file a seal seals)
  accepted      exit 0, or the reader returned (damage: unseen)
  traceback     a Python traceback (or, for damage, any other exception)
  weak          anything else: another exit code, several lines
  working       no answer within the timeout and no error yet (a benchmark on values it accepted; a hang looks
                the same: read by a person)
  left RUNNING  the try's store holds a run still RUNNING once the command answered

A value may be accepted, damage may not. Every try that is neither is printed, then the counts; the exit status
is 1 when any try ended otherwise. Run it from a clone (an accepted value writes where its defaults say):

    git clone -q . /tmp/fuzz && cd /tmp/fuzz && python tools/fuzz.py      # the whole round
    python tools/fuzz.py --table damage             # one table (values or damage)
    python tools/fuzz.py --only prepare,pos=rope     # the tries whose label starts so
    python tools/fuzz.py --processes 150            # 150 value tries spread over the round, each `python run.py …`
    python tools/fuzz.py --run-accepted             # then run (two steps) every config value ``check`` accepted
    python tools/fuzz.py --fast                     # the suite's slice (tests/runs/test_fuzz.py)

The MLflow store is left out of the damage table: most bytes of an sqlite file are page structure and free space,
where a flip changes no value; each kind of value a run record holds is damaged one by one in
tests/unit/test_run_seal.py instead.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG_VALUES = [
    "abc",
    "-1",
    "0",
    "1e300",
    "nan",
    "99999999999999999999",
    "null",
    "true",
    "[]",
    "{{a:1}}",
]  # {{ }}: format
FLAG_VALUES = [
    "",
    "-1",
    "0",
    "nan",
    "inf",
    "1e300",
    "abc",
    "99999999999999999999",
    "/proc/posbench",
    "{file}",
    "{missing}/x",
]
GROUPS = ("pos", "attn", "task", "data", "tokenizer", "model", "optim", "trainer")
SMALL = [
    "model.n_layers=1",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "data.batch_size=4",
    "data.seq_len=32",
    "trainer.max_steps=2",
]
# what each command needs besides the flag tried (its required arguments), "{…}" filled per try
BASES = {
    ("report",): ["report", "--out", "{tmp}/out", "--tracking-uri", "{store}"],
    ("paper",): ["paper", "--preset", "grid", "--tracking-uri", "{store}", "--out", "{tmp}/out"],
    ("tune",): ["tune", "--out", "{tmp}/out", "--tracking-uri", "{store}"],
    ("index",): ["index", "--dir", "{tmp}/index"],
    ("bench",): ["bench", "--out", "{tmp}/bench"],
    ("bench", "gpu"): ["bench", "gpu", "--out", "{tmp}/gpu"],
    ("bench", "loader"): ["bench", "loader", "--dir", "{tmp}"],
    ("bench", "attention"): ["bench", "attention"],
    ("prepare",): ["prepare", "{tmp}/shards", "data=text", "data.path={words}"],
    ("hf-eval",): ["hf-eval", "{model}", "--check", "--tracking-uri", "{store}"],
}
PLACES = 16  # damage: offsets per file, 0, len/15, 2·len/15, …, the last byte; a file of at most EVERY bytes: each
EVERY = 4096


@dataclass
class Try:
    label: str
    attempt: Callable[[Path], tuple[str, str]]  # in a fresh folder: (how it ended, what the user saw)
    allowed: tuple[str, ...] = ("one line", "accepted")


# ---------------------------------------------------------------- values


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


@functools.cache
def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Each command's parser, caught as the command asks it to parse (nothing else runs)."""
    from harness import main as posbench

    def caught(self, *_, **__):
        raise _Captured(self)

    found = {}
    # each command's parser is caught where it would parse (every command calls parse_args): argparse's method patched
    # for this loop, put back after
    with mock.patch.object(argparse.ArgumentParser, "parse_args", caught):
        for key in BASES:
            try:
                posbench.COMMANDS[key[0]](list(key[1:]))
            except _Captured as c:  # results' commands: the subcommand's parser
                subcommands = (a for a in c.parser._actions if isinstance(a, argparse._SubParsersAction))
                found[key] = next((a.choices[key[0]] for a in subcommands), c.parser)
    return found


def _flag_values(fast: bool = False) -> list[tuple[str, list[str]]]:
    """(label, argv): each value of ``FLAG_VALUES`` for each flag that takes a value (``fast``: "nan" for each flag
    that parses its value as a number, its parser declaring a type)."""
    tries = []
    for key, parser in _parsers().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue  # positionals are in the bases; switches take no value
            flag, base = action.option_strings[-1], list(BASES[key])
            if flag in base:  # the base's own value replaced
                del base[base.index(flag) : base.index(flag) + 2]
            values = (["nan"] if action.type not in (None, str) else []) if fast else FLAG_VALUES
            tries += [(f"{' '.join(key)} {flag}={value!r}", [*base, flag, value]) for value in values]
    return tries


def _config_values(fast: bool = False) -> list[tuple[str, list[str]]]:
    """(label, argv): each value of ``CONFIG_VALUES`` for every leaf key of each group's every option, under check
    (``fast``: the 64-bit overflow alone, or true for a switch that is off)."""
    from omegaconf import OmegaConf

    from harness.config.catalog import options
    from harness.config.load import compose
    from harness.record.run import flatten

    seen, tries = set(), []
    for group in GROUPS:
        for option in options(group, need_target=False):
            cfg = OmegaConf.to_container(compose([f"{group}={option}"])[group], resolve=False)
            assert isinstance(cfg, dict), f"{group} composes to a mapping"
            for leaf, default in flatten(cfg, f"{group}.").items():  # its leaf keys, dotted
                if leaf in seen or leaf.rsplit(".", 1)[-1].startswith("_"):
                    continue
                seen.add(leaf)
                fast_value = "true" if default == "False" else "99999999999999999999"  # a switch: the one it is off
                tries += [
                    (f"{group}={option} {leaf}={value}", ["check", *SMALL, f"{group}={option}", f"{leaf}={value}"])
                    for value in ([fast_value] if fast else CONFIG_VALUES)
                ]
    return tries


def _classify(reply: dict) -> str:
    err = reply["stderr"]
    lines = [
        line
        for line in err.splitlines()
        if line.strip()
        and " INFO " not in line
        and "[HYDRA]" not in line
        and "Warning" not in line
        and not line.startswith(("  warnings.warn", "  return F."))
        and not re.match(r"^/\S+\.py:\d+: ", line)
    ]  # a library's warning (warnings.showwarning's form)
    if reply.get("working"):
        return "working"
    if "Traceback" in err:
        return "traceback"
    if reply["code"] == 0:
        return "accepted"
    if reply["code"] in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
        return "one line"
    return "weak"


def _value_inputs(work: Path) -> dict[str, Path]:
    """The files value tries point at, written into ``work``: a plain file, a small text, a tiny Llama folder."""
    from tests.helpers import tiny_llama

    (work / "a_file").write_text("x")
    (work / "words.txt").write_bytes(b"alpha beta gamma delta " * 4600)
    return {
        "file": work / "a_file",
        "missing": work / "missing",
        "words": work / "words.txt",
        "model": tiny_llama(work / "llama"),
    }


def command(argv: list[str], folder: Path, files: dict[str, Path], timeout: float, process: bool = False) -> dict:
    """``argv`` in ``folder`` with its own store: through posbench's entry function in this interpreter, or as a
    user's process (``python run.py ARGV``: the exit status and streams as a shell sees them)."""
    import subprocess

    from tests import inprocess

    fill = {**files, "tmp": folder, "store": f"sqlite:///{folder / 'mlflow.db'}"}
    argv = [a.format(**fill) for a in argv]
    env = {"MLFLOW_TRACKING_URI": str(fill["store"])}
    try:
        if not process:
            return inprocess.run("run", argv, str(folder), env, timeout)
        done = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), *argv],
            cwd=folder,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return {"code": done.returncode, "stderr": done.stderr, "stdout": done.stdout}
    except (inprocess.Hung, subprocess.TimeoutExpired):
        return {"code": None, "stderr": "", "stdout": "", "working": True}


def _left_running(folder: Path) -> int:
    """Runs the try's store holds in status RUNNING (none may be, once a command has answered)."""
    import sqlite3

    try:  # read-only: a store that is not there is not created
        with contextlib.closing(sqlite3.connect(f"file:{folder / 'mlflow.db'}?mode=ro", uri=True)) as db:
            return db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
    except sqlite3.OperationalError:  # no store, or a store with no tables yet
        return 0


def _value_try(
    label: str,
    argv: list[str],
    files: dict[str, Path],
    timeout: float,
    process: bool = False,
    run_accepted: bool = False,
) -> Try:
    def attempt(folder: Path) -> tuple[str, str]:
        reply = command(argv, folder, files, timeout, process)
        # a config value check accepted, then trained: do check and run agree?
        if run_accepted and argv[0] == "check" and not _left_running(folder) and _classify(reply) == "accepted":
            reply = command(
                [
                    "run",
                    *argv[1:],
                    "trainer.val_check_interval=2",
                    "data.eval_batches=1",
                    "trainer.enable_progress_bar=false",
                    "checkpoint.every_n_steps=0",
                    f"hydra.run.dir={folder}/run",
                ],
                folder,
                files,
                max(timeout, 120.0),
            )
        kind = "left RUNNING" if _left_running(folder) else _classify(reply)
        return kind, f"exit {reply['code']}: " + " | ".join(reply["stderr"].strip().splitlines()[-2:])[:300]

    return Try(label, attempt)


# ---------------------------------------------------------------- damage


@dataclass
class Kind:
    name: str
    folder: Path  # as the harness wrote it; each try damages a copy
    target: str  # the file to damage, relative to ``folder``
    read: Callable[[Path], object]  # reads a copy of the folder as the command that uses it does


def _damage_kinds(root: Path) -> list[Kind]:
    """Every kind's folder under ``root``, written by the harness's own writers."""
    import torch

    from harness import integrity
    from harness.config.load import tuned_values
    from harness.data import corpus as corpus_module
    from harness.data import shards as shards_module
    from harness.data.corpus import Embedded, TextFiles
    from harness.data.subword import BPE
    from harness.main import prepare_shards
    from harness.pretrained.folder import read as read_export
    from harness.record.callbacks import CommittedCheckpoints
    from harness.record.resume import RunLink, checkpoint_step, latest_checkpoint
    from harness.sweep.callback import SweepRecord
    from tests.helpers import tiny_export

    root.mkdir(parents=True)
    words = root / "words.txt"
    words.write_text(
        "".join(f"Line {i}: positions {i % 13} and attention {i % 7} in a transformer.\n" for i in range(3000))
    )

    def whole(folder: Path):
        shards_module._VERIFIED.clear()
        return shards_module.TokenShards(str(folder / "f")).sizes()

    def by_block(folder: Path):
        with mock.patch.dict(os.environ, {"POSBENCH_HASH_WHOLE_BYTES": "0"}):
            loaded = shards_module.TokenShards(str(folder / "f")).load()
            for ids in (loaded.train_ids, loaded.val_ids):
                for start in range(0, len(ids), 4096):  # every window a run could read
                    ids[start : start + 4096]

    def in_cache(folder: Path, read):
        corpus_module.CACHE = folder / "c"
        return read()

    shards, bpe = root / "shards", root / "bpe"
    prepare_shards(shards / "f", ["data=text", f"data.path={words}"], shard_tokens=40_000)
    corpus_module.CACHE = root / "cache"
    prepare_shards(bpe / "f", ["data=text", f"data.path={words}", "tokenizer=bpe", "tokenizer.vocab_size=300"])

    corpus_cache = root / "corpus_cache"
    in_cache(corpus_cache, Embedded().load)
    Embedded().document_starts()
    text = next((corpus_cache / "c").glob("stdlib-prose-*.txt")).name
    starts = next((corpus_cache / "c").glob("*.starts.npy")).name

    vocab_cache = root / "vocab_cache"
    text_corpus = in_cache(vocab_cache, TextFiles(str(words)).load)
    BPE(vocab_size=300).fit(text_corpus)
    vocabulary = "c/tokenizers/" + next((vocab_cache / "c" / "tokenizers").glob("bpe-v300-*.json")).name

    class Trainer:  # what the checkpoint callback reads of Lightning's trainer
        is_global_zero, global_step = True, 4

        def save_checkpoint(self, path):
            torch.save({"global_step": 4, "weights": torch.arange(5_000.0)}, path)

    checkpoints, sweep, tuned, export, report = (
        root / n for n in ("checkpoints", "sweep", "tuned", "export", "report")
    )
    for folder in (checkpoints, sweep, tuned, report):
        folder.mkdir()
    callback = CommittedCheckpoints(checkpoints, every=4, flush=lambda: None)
    callback.on_train_batch_end(Trainer(), None, None, None, 0)
    callback.on_train_batch_start(Trainer(), None, None, 0)
    RunLink("0123abcd", "f" * 16, "sqlite:////tmp/mlflow.db", "posbench").save(checkpoints)
    SweepRecord("0123abcd", "20261127-000000-abcd", "sqlite:////tmp/mlflow.db", "posbench", ["pos"]).save(sweep)
    integrity.write(tuned / "best.json", {"cells": {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": 3e-4}}}})
    tiny_export(export)
    (report / "README.md").write_text("# grid\n\n**Verdict: rope lower than t5 (p = 0.03)**\n" + "text\n" * 40)
    (report / "report.csv").write_text("pos,final_val_loss\nrope,2.5\nt5,2.7\n")
    (report / "plot.png").write_bytes(bytes(range(256)) * 16)
    integrity.seal_report(report)

    def vocab(f):
        return in_cache(f, lambda: BPE(vocab_size=300).fit(text_corpus))

    def resumed(f):
        return checkpoint_step(latest_checkpoint(f) or f / "step-4.ckpt")

    def reported(f):
        return integrity.check_report(f, "run its command again", needs=["README.md"])

    return [
        Kind("shard, hashed whole", shards, "f/train-00001.bin", whole),
        Kind("shard, by block", shards, "f/train-00001.bin", by_block),
        Kind("manifest.json", shards, "f/manifest.json", whole),
        Kind(
            "a prepared folder's tokenizer.json",
            bpe,
            "f/tokenizer.json",
            lambda f: BPE(vocab_size=300).fit(shards_module.TokenShards(str(f / "f")).load()),
        ),
        Kind("the embedded corpus cache", corpus_cache, f"c/{text}", lambda f: in_cache(f, Embedded().load)),
        Kind("its seal", corpus_cache, f"c/{text}.sha256", lambda f: in_cache(f, Embedded().load)),
        Kind(
            "the document starts cache", corpus_cache, f"c/{starts}", lambda f: in_cache(f, Embedded().document_starts)
        ),
        Kind("a cached vocabulary", vocab_cache, vocabulary, vocab),
        Kind("its seal", vocab_cache, f"{vocabulary}.sha256", vocab),
        Kind("a checkpoint", checkpoints, "step-4.ckpt", resumed),
        Kind("its seal", checkpoints, "step-4.ckpt.sha256", resumed),
        Kind("run.json", checkpoints, "run.json", RunLink.load),
        Kind("mlflow_sweep.json", sweep, "mlflow_sweep.json", SweepRecord.load),
        Kind("best.json", tuned, "best.json", lambda f: tuned_values(str(f / "best.json"), "rope", "softmax")),
        Kind("an export's model.safetensors", export, "model.safetensors", read_export),
        Kind("an export's config.json", export, "config.json", read_export),
        Kind("its seal", export, "config.json.sha256", read_export),
        *(
            Kind(f"a report folder's {name}", report, name, reported)
            for name in ("README.md", "plot.png", integrity.SUMS)
        ),
    ]


def _damage_try(kind: Kind, place: int, each_byte: bool) -> Try:
    def attempt(folder: Path) -> tuple[str, str]:
        from harness.errors import ConfigError, one_line

        shutil.copytree(kind.folder, folder, dirs_exist_ok=True)
        target = folder / kind.target
        data = bytearray(target.read_bytes())
        at = place if each_byte else round(place * (len(data) - 1) / (PLACES - 1))
        data[at] ^= 1 << (place % 8)
        target.write_bytes(bytes(data))
        try:
            kind.read(folder)
        except ConfigError as e:
            named = target.name in str(e) or target.name.removesuffix(".sha256") in str(e)
            return ("one line" if named and "\n" not in str(e) else "weak"), f"byte {at}: {str(e)[:160]}"
        except Exception as e:  # noqa: BLE001 (what the round counts)
            return "traceback", f"byte {at}: {type(e).__name__}: {one_line(e)[:160]}"
        return "accepted", f"byte {at}"

    return Try(f"damage {kind.name} ({kind.target}) place {place}", attempt, allowed=("one line",))


def _damage_tries(root: Path, every: int) -> list[Try]:
    """``PLACES`` spread places of each kind's file, or each byte of a file of at most ``every`` bytes."""
    found = []
    for kind in _damage_kinds(root):
        size = (kind.folder / kind.target).stat().st_size
        found += [_damage_try(kind, place, size <= every) for place in range(size if size <= every else PLACES)]
    return found


# ---------------------------------------------------------------- the round


def tries(work: Path, args: argparse.Namespace) -> list[Try]:
    """The round's tries (``--fast``: a 64-bit overflow for every config key (true for an off switch), "nan" for every
    typed flag, and the damage at the 16 spread places only)."""
    timeout = 60.0 if args.processes else args.timeout
    values = [*_flag_values(args.fast), *_config_values(args.fast)] if args.table in ("all", "values") else []
    prefixes = tuple(args.only.split(","))  # --only's default, "", starts every label
    values = [t for t in values if t[0].startswith(prefixes)]
    if args.processes:  # a sample spread evenly over the round, each try a real process
        values = [values[round(i * len(values) / args.processes)] for i in range(min(args.processes, len(values)))]
    files = _value_inputs(work) if values else {}
    found = [_value_try(label, argv, files, timeout, bool(args.processes), args.run_accepted) for label, argv in values]
    if args.table in ("all", "damage"):
        found += [t for t in _damage_tries(work / "built", 0 if args.fast else EVERY) if t.label.startswith(prefixes)]
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--fast", action="store_true", help="the suite's slice")
    p.add_argument("--table", choices=("all", "values", "damage"), default="all", help="one table of tries")
    p.add_argument("--only", default="", help="comma-separated label prefixes: prepare,pos=,damage a checkpoint")
    p.add_argument("--processes", type=int, default=0, help="this many value tries, each a real process")
    p.add_argument("--run-accepted", action="store_true", help="run every config value check accepted")
    p.add_argument("--show-accepted", action="store_true", help="print accepted tries too")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds a value try may take in process")
    args = p.parse_args(argv)
    from harness.data import corpus

    with (
        tempfile.TemporaryDirectory(prefix="posbench-fuzz-", ignore_cleanup_errors=True) as tmp,
        mock.patch.object(corpus, "CACHE", corpus.CACHE),  # the damage table points it at its folders
    ):
        work = Path(tmp)
        found = tries(work, args)
        print(f"{len(found)} tries", flush=True)
        counts: collections.Counter[str] = collections.Counter()
        missed = 0
        for i, one in enumerate(found):
            folder = work / f"try{i}"
            folder.mkdir()
            kind, said = one.attempt(folder)
            counts[kind] += 1
            missed += kind not in one.allowed
            if kind not in one.allowed or (kind == "accepted" and args.show_accepted):
                print(f"{kind:<12} {one.label}  →  {said}", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
        print(
            ", ".join(f"{k} {v}" for k, v in counts.most_common()) + f" (of {len(found)} tries; {missed} not as "
            "allowed)"
        )
        return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
