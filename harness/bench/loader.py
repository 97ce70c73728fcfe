"""Can the data keep up? ``python -m harness.bench.loader``: the training loader's throughput from prepared
shards against what the model consumes at a preset's paper shapes, and the start-up time of a ``--gb`` corpus.

- Loader: tokens/s of the training DataLoader a run builds (``make_loaders``, ``data.num_workers`` from
  ``--workers``) over ``data=tokens`` shards, per objective (MLM masking, CLM shift) and window order, at the
  preset's ``data.batch_size`` × ``data.seq_len`` (conf/experiment/<preset>/scale/paper.yaml); the fastest of
  ``--repeats`` timings.
- Model: tokens/s one GPU trains at, *estimated* from FLOPs, not measured: a training step costs
  6·N + 6·n_layers·T·d_model FLOPs a token (Kaplan et al. 2020, Table 1: forward 2·N + 2·n_layer·n_ctx·d_attn,
  backward twice that), N = n_layers·(4·d² + 2·d·d_ff) + d·V (blocks and the output layer), at ``--tflops``
  (default 989: an H100 SXM's dense bf16 peak) × ``--mfu`` (default 0.4) — say so when quoting it. With DDP
  every rank has its own loader and GPU, so the ratio holds per rank.
- Start-up: a shard of ``--gb`` GB of random ids (uint16) is written under ``--dir``, then timed from the source's
  checks (manifest, shard sizes) through the memory maps to the first training batch; the shard is deleted after.
  The file was just written, so its pages are in the page cache (a memory map reads only the windows drawn).
- ``--shards DIR`` times a folder ``posbench prepare`` wrote instead (your corpus's real ids, its
  shards as they lie on your disk, cold or cached as they are): nothing is written or deleted, and the model's FLOPs
  take the manifest's vocabulary unless ``--vocab`` says otherwise.

The goal: the loader at ≥ 10 × the model's tokens/s, so data never stalls a step.

Every flag is checked before anything is written (one line naming the fix, exit 2): a shard smaller than one
batch of the largest preset, or larger than the free space at ``--dir`` (less a margin), is refused; worker
counts are bounded as ``data.num_workers`` is (``harness.config.spec.max_workers``); the shard is always deleted after.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

from harness.bench.internals import compose_cell, shard_loader, write_random_shards
from harness.bench.measure import time_call, timed_steps
from harness.config.spec import WORKERS_PER_CORE, max_workers
from harness.errors import ConfigError, OneLineParser, said_refusal
from harness.paths import CONF
from harness.ranges import Fraction, Positive, PositiveInt, at_most
from harness.record.preflight import number, output_dir

TEXT_PRESETS = ("grid", "roformer_mlm", "alibi_extrapolation", "eleuther_rotary", "roformer_performer")


@cache
def paper_shapes(preset: str) -> dict:
    """n_layers, d_model, d_ff, seq_len, batch_size of ``preset`` at scale=paper, composed as run.py composes it."""
    spec = compose_cell([f"experiment={preset}", "scale=paper"])
    return {
        "n_layers": spec.model.n_layers,
        "d_model": spec.model.d_model,
        "d_ff": spec.model.d_ff,
        "seq_len": spec.data.seq_len,
        "batch_size": spec.data.batch_size,
    }


def train_flops_per_token(shapes: dict, vocab: int) -> float:
    """6·N + 6·n_layers·T·d (module docstring)."""
    d, layers = shapes["d_model"], shapes["n_layers"]
    n = layers * (4 * d * d + 2 * d * shapes["d_ff"]) + d * vocab
    return 6 * n + 6 * layers * shapes["seq_len"] * d


def _loader_tokens_per_s(
    folder: Path, objective: str, windows: str, shapes: dict, n_batches: int, workers: int = 0
) -> float:
    warm = 2 + 2 * workers  # the workers' first batches: started, not steady
    batches = iter(
        shard_loader(folder, objective, windows, shapes["seq_len"], shapes["batch_size"], n_batches + warm, workers)
    )
    seconds = timed_steps(partial(next, batches), "cpu", warm, n_batches)  # each batch B × T ids
    return n_batches * shapes["batch_size"] * shapes["seq_len"] / sum(seconds)


def startup_seconds(folder: Path, shapes: dict) -> float:
    """From the source's checks to the first batch (modules imported before: a run has imported them)."""
    return time_call(
        lambda: next(iter(shard_loader(folder, "mlm", "random", shapes["seq_len"], shapes["batch_size"], 4))), "cpu"
    )


MARGIN = 0.9  # of the free space at --dir a shard may take


@dataclass(frozen=True)
class Args:
    presets: list[str]
    gb: float | None  # None: --shards (``dir`` is timed as it is: nothing written or deleted)
    dir: Path  # --shards' folder, or where the random shard is written
    batches: int
    tflops: float
    mfu: float
    vocab: int
    workers: list[int]
    repeats: int
    json: Path | None


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m harness.bench.loader", description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=",".join(TEXT_PRESETS), help="comma-separated presets with a paper scale")
    p.add_argument(
        "--gb", type=number(Positive), default=None, help="size of the generated shard, GB (10^9 bytes; default 1)"
    )
    p.add_argument(
        "--shards",
        help="time this prepared shard folder (posbench prepare) instead of "
        "writing random shards; nothing is written or deleted",
    )
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the shard is written (then deleted)")
    p.add_argument(
        "--batches", type=number(at_most(PositiveInt, 100_000), int), default=30, help="batches timed per loader"
    )
    p.add_argument(
        "--tflops", type=number(Positive), default=989.0, help="GPU peak, TFLOP/s (H100 SXM dense bf16: 989)"
    )
    p.add_argument("--mfu", type=number(Fraction), default=0.4, help="model FLOPs utilisation assumed, in (0, 1]")
    p.add_argument(
        "--vocab",
        type=number(PositiveInt, int),
        default=None,
        help="vocabulary size for the output layer's FLOPs (default: the shards' own, else 258)",
    )
    p.add_argument("--workers", default="0", help="comma-separated data.num_workers to time, e.g. 0,2,4")
    p.add_argument(
        "--repeats",
        type=number(at_most(PositiveInt, 1000), int),
        default=3,
        help="timings per row; the fastest is reported (the others lost time to other processes)",
    )
    p.add_argument("--json", help="also write the figures here")
    return p


def parse(argv: list[str] | None) -> Args:
    """The flags, each checked; a ConfigError names the fix."""
    a = _parser().parse_args(argv)
    presets = [x for x in a.presets.split(",") if x]
    have = sorted(p.parent.parent.name for p in (CONF / "experiment").glob("*/scale/paper.yaml"))
    unknown = [x for x in presets if x not in have]
    if unknown or not presets:
        raise ConfigError(
            f"--presets {','.join(unknown) or repr(a.presets)}: no paper scale "
            f"(conf/experiment/<preset>/scale/paper.yaml); use some of {', '.join(have)}"
        )
    workers = _workers(a.workers)
    need = max(paper_shapes(p)["batch_size"] * (paper_shapes(p)["seq_len"] + 1) for p in presets) * 2  # uint16
    if a.shards is not None:
        if a.gb is not None:
            raise ConfigError("--gb sizes the random shard written when --shards is not given; give one of them")
        (folder, vocab), gb = _prepared(a.shards, need // 2), None
    else:
        folder, gb, vocab = _writable_dir(a.dir), 1.0 if a.gb is None else a.gb, 258
        if gb * 1e9 < need:
            raise ConfigError(
                f"--gb {gb:g} holds less than one batch of the largest preset ({need:,} bytes); "
                f"give at least --gb {math.ceil(need / 1e7) / 100:g}"
            )
        free = shutil.disk_usage(folder).free
        if gb * 1e9 > MARGIN * free:
            raise ConfigError(
                f"--gb {gb:g} needs {gb:g} GB at {folder}, which has {free / 1e9:.1f} GB free; "
                f"give --gb {MARGIN * free / 1e9:.1f} or less, or --dir a folder with more room"
            )
    out = None
    if a.json is not None:
        out = Path(a.json).expanduser().absolute()
        output_dir(out.parent, "--json")  # written to, by this user, as a file is (/proc refuses one)
        if out.is_dir() or not out.parent.is_dir():
            raise ConfigError(f"--json {a.json}: give a file path in a writable folder")
    return Args(
        presets,
        gb,
        folder,
        a.batches,
        a.tflops,
        a.mfu,
        vocab if a.vocab is None else a.vocab,
        workers,
        a.repeats,
        out,
    )


def _prepared(text: str, tokens: int) -> tuple[Path, int]:
    """(the folder, its vocabulary) of a prepared shard folder whose training split holds a batch of ``tokens``
    ids, checked as ``data=tokens`` checks it (manifest, every shard's size)."""
    from harness.data.shards import TokenShards

    folder = Path(text).expanduser().absolute()
    try:
        source = TokenShards(str(folder))
        train, _ = source.sizes()
        vocab = int(source.manifest()["tokenizer"]["vocab_size"])
    except ConfigError as e:
        raise ConfigError(f"--shards {text}: {e}") from None
    if train < tokens:
        raise ConfigError(
            f"--shards {text}: its training split holds {train:,} ids, less than one batch of the "
            f"largest preset ({tokens:,}); give a larger folder or --presets with smaller batches"
        )
    return folder, vocab


def _workers(text: str) -> list[int]:
    bound = max_workers()
    try:
        workers = [int(x) for x in text.split(",")]
    except ValueError:
        workers = []
    if not workers or any(w < 0 or w > bound for w in workers):
        raise ConfigError(
            f"--workers {text!r}: give a comma list of worker counts from 0 to {bound} "
            f"({WORKERS_PER_CORE} per core here, as data.num_workers), e.g. 0,2,4"
        )
    return workers


def _writable_dir(text: str, flag: str = "--dir") -> Path:
    folder = Path(text).expanduser().absolute()
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {text!r}: not a folder this user can write; give an existing, writable folder")
    return folder


def measure(args: Args) -> dict:
    """Write the shard (or take --shards' folder), time the start-up and every loader; a written shard is deleted
    whatever happens, a given folder left as it is."""
    folder = args.dir if args.gb is None else Path(tempfile.mkdtemp(prefix="posbench-loader-", dir=args.dir))
    rows = []
    figures = {
        "gpu_tflops": args.tflops,
        "mfu": args.mfu,
        "vocab": args.vocab,
        "gb": args.gb,
        "shards": str(folder) if args.gb is None else None,
        "write_seconds": None,
    }
    try:
        if args.gb is not None:
            one_shard = partial(write_random_shards, folder, int(args.gb * 1e9) // 2)  # one training shard
            figures["write_seconds"] = time_call(one_shard, "cpu")
        figures["shard_bytes"] = sum(f.stat().st_size for f in folder.glob("train-*.bin"))
        figures["startup_seconds"] = startup_seconds(folder, paper_shapes(args.presets[0]))
        for preset in args.presets:
            shapes = paper_shapes(preset)
            model = args.tflops * 1e12 * args.mfu / train_flops_per_token(shapes, args.vocab)
            for objective, windows, workers in itertools.product(
                ("mlm", "clm"), ("random", "sequential"), args.workers
            ):
                tps = max(
                    _loader_tokens_per_s(folder, objective, windows, shapes, args.batches, workers)
                    for _ in range(args.repeats)
                )
                rows.append(
                    {
                        "preset": preset,
                        **shapes,
                        "objective": objective,
                        "windows": windows,
                        "workers": workers,
                        "loader_tokens_per_s": tps,
                        "model_tokens_per_s": model,
                        "ratio": tps / model,
                    }
                )
    finally:
        if args.gb is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return {**figures, "rows": rows}


def show(figures: dict) -> None:
    if figures["shards"]:
        print(
            f"shards at {figures['shards']} ({figures['shard_bytes']:,} bytes of training ids, vocabulary "
            f"{figures['vocab']:,}): start-up to the first batch {figures['startup_seconds'] * 1e3:.1f} ms"
        )
    else:
        print(
            f"{figures['gb']:g} GB shard ({figures['shard_bytes']:,} bytes): written in "
            f"{figures['write_seconds']:.1f} s; start-up to the first batch "
            f"{figures['startup_seconds'] * 1e3:.1f} ms"
        )
    print(
        f"model tokens/s: estimated at {figures['gpu_tflops']:g} TFLOP/s × MFU {figures['mfu']:g} "
        "(6N + 6·L·T·d FLOPs a token)"
    )
    print(
        f"{'preset':<22}{'L×d':>9}{'B×T':>10}{'task':>6}{'windows':>12}{'workers':>8}{'loader tok/s':>15}"
        f"{'model tok/s':>14}{'ratio':>8}"
    )
    for r in figures["rows"]:
        print(
            f"{r['preset']:<22}{r['n_layers']:>4}×{r['d_model']:<4}{r['batch_size']:>5}×{r['seq_len']:<4}"
            f"{r['objective']:>6}{r['windows']:>12}{r['workers']:>8}{r['loader_tokens_per_s']:>15,.0f}"
            f"{r['model_tokens_per_s']:>14,.0f}{r['ratio']:>7.1f}×"
        )


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        return said_refusal(e)
    figures = measure(args)
    show(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
