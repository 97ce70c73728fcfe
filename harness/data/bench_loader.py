"""Can the data keep up? ``python -m harness.data.bench_loader``: the training loader's throughput from prepared
shards against what the model consumes at a preset's paper shapes, and the start-up time of a 1 GB corpus.

- Loader: tokens/s of the training DataLoader a run builds (``make_loaders``, ``data.num_workers`` from
  ``--workers``) over ``data=tokens`` shards, per objective (MLM masking, CLM shift) and window order, at the
  preset's ``data.batch_size`` × ``data.seq_len`` (conf/experiment_scale/<preset>/paper.yaml); the fastest of
  ``--repeats`` timings.
- Model: tokens/s one GPU trains at, *estimated* from FLOPs, not measured: a training step costs
  6·N + 6·n_layers·T·d_model FLOPs a token (Kaplan et al. 2020, Table 1: forward 2·N + 2·n_layer·n_ctx·d_attn,
  backward twice that), N = n_layers·(4·d² + 2·d·d_ff) + d·V (blocks and the output layer), at ``--tflops``
  (default 989: an H100 SXM's dense bf16 peak) × ``--mfu`` (default 0.4) — say so when quoting it. With DDP
  every rank has its own loader and GPU, so the ratio holds per rank.
- Start-up: a 1 GB shard of random ids (uint16) is written under ``--dir``, then timed from the source's checks
  (manifest, shard sizes) through the memory maps to the first training batch; the shard is deleted after.
  The file was just written, so its pages are in the page cache (a memory map reads only the windows drawn).

The goal: the loader at ≥ 10 × the model's tokens/s, so data never stalls a step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from harness.paths import CONF

TEXT_PRESETS = ("grid", "roformer_mlm", "alibi_extrapolation", "eleuther_rotary", "roformer_performer")


def paper_shapes(preset: str) -> dict:
    """n_layers, d_model, d_ff, seq_len, batch_size of ``preset`` at scale=paper (model/small.yaml fills gaps)."""
    base = OmegaConf.load(CONF / "model" / "small.yaml")
    scale = OmegaConf.load(CONF / "experiment_scale" / preset / "paper.yaml")
    model, data = {**base, **scale.get("model", {})}, scale.get("data", {})
    return {"n_layers": model["n_layers"], "d_model": model["d_model"], "d_ff": model["d_ff"],
            "seq_len": data.get("seq_len", 128), "batch_size": data.get("batch_size", 32)}


def train_flops_per_token(shapes: dict, vocab: int) -> float:
    """6·N + 6·n_layers·T·d (module docstring)."""
    d, layers = shapes["d_model"], shapes["n_layers"]
    n = layers * (4 * d * d + 2 * d * shapes["d_ff"]) + d * vocab
    return 6 * n + 6 * layers * shapes["seq_len"] * d


def write_shards(folder: Path, n_tokens: int, vocab: int = 258, seed: int = 0) -> None:
    """Random uint16 ids in one training shard (and a small validation one), with a byte-tokenizer manifest."""
    from harness.data.prepare import ShardWriter
    from harness.data.shards import FORMAT
    from harness.data.tokenizer import ByteTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writers = {"train": ShardWriter(folder, "train", np.dtype(np.uint16), n_tokens),
               "val": ShardWriter(folder, "val", np.dtype(np.uint16), n_tokens)}
    step = 1 << 26
    for start in range(0, n_tokens, step):
        ids = rng.integers(0, 256, min(step, n_tokens - start), dtype=np.uint16)
        writers["train"].write(ids, len(ids))
    writers["val"].write(rng.integers(0, 256, 1 << 16, dtype=np.uint16), 1 << 16)
    splits = {k: w.close() for k, w in writers.items()}
    manifest = {"format": FORMAT, "corpus": {"name": "random", "sha256": "0" * 64, "bytes": n_tokens,
                                             "train_sha256": "0" * 64},
                "tokenizer": {"config": "byte", "digest": ByteTokenizer().digest(), "vocab_size": 258,
                              "recipe": None},
                "dtype": "uint16", "splits": splits}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def loader(folder: Path, objective: str, windows: str, seq_len: int, batch_size: int, n_batches: int,
           workers: int = 0):
    """The training DataLoader a run builds over the shards (make_loaders)."""
    from harness.data.loaders import make_loaders
    from harness.data.objectives import CausalLM, MaskedLM
    from harness.data.shards import TokenShards
    from harness.data.tokenizer import ByteTokenizer

    source = TokenShards(str(folder), windows)
    source.sizes()  # what validation checks: the manifest and every shard's size
    corpus = source.load()
    task = (MaskedLM if objective == "mlm" else CausalLM)(ByteTokenizer())
    train, _ = make_loaders(corpus, task, seq_len, batch_size, n_train=n_batches * batch_size, seed=0,
                            num_workers=workers)
    return train


def loader_tokens_per_s(folder: Path, objective: str, windows: str, shapes: dict, n_batches: int,
                        workers: int = 0) -> float:
    warm = 2 + 2 * workers  # the workers' first batches: started, not steady
    batches = iter(loader(folder, objective, windows, shapes["seq_len"], shapes["batch_size"], n_batches + warm,
                          workers))
    for _ in range(warm):
        next(batches)
    start = time.perf_counter()
    for _ in range(n_batches):
        batch = next(batches)
    seconds = time.perf_counter() - start
    return n_batches * batch["input_ids"].numel() / seconds


def startup_seconds(folder: Path, shapes: dict) -> float:
    """From the source's checks to the first batch (modules imported before: a run has imported them)."""
    import harness.data.loaders  # noqa: F401  (Lightning's sampler: seconds to import, not the data's cost)

    start = time.perf_counter()
    next(iter(loader(folder, "mlm", "random", shapes["seq_len"], shapes["batch_size"], 4)))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.data.bench_loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(TEXT_PRESETS), help="comma-separated text presets")
    parser.add_argument("--gb", type=float, default=1.0, help="size of the generated shard, GB (10^9 bytes)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the shard is written (then deleted)")
    parser.add_argument("--batches", type=int, default=30, help="batches timed per loader")
    parser.add_argument("--tflops", type=float, default=989.0, help="GPU peak, TFLOP/s (H100 SXM dense bf16: 989)")
    parser.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed")
    parser.add_argument("--vocab", type=int, default=258, help="vocabulary size for the output layer's FLOPs")
    parser.add_argument("--workers", default="0", help="comma-separated data.num_workers to time, e.g. 0,2,4")
    parser.add_argument("--repeats", type=int, default=3, help="timings per row; the fastest is reported (the "
                        "others lost time to other processes)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="posbench-loader-", dir=args.dir))
    rows, figures = [], {"gpu_tflops": args.tflops, "mfu": args.mfu, "vocab": args.vocab}
    try:
        n_tokens = int(args.gb * 1e9) // 2
        start = time.perf_counter()
        write_shards(folder, n_tokens)
        figures["write_seconds"] = time.perf_counter() - start
        figures["shard_bytes"] = (folder / "train-00000.bin").stat().st_size
        first = paper_shapes(args.presets.split(",")[0])
        figures["startup_seconds"] = startup_seconds(folder, first)
        for preset in args.presets.split(","):
            shapes = paper_shapes(preset)
            model = args.tflops * 1e12 * args.mfu / train_flops_per_token(shapes, args.vocab)
            for objective in ("mlm", "clm"):
                for windows in ("random", "sequential"):
                    for workers in map(int, args.workers.split(",")):
                        tps = max(loader_tokens_per_s(folder, objective, windows, shapes, args.batches, workers)
                                  for _ in range(args.repeats))
                        rows.append({"preset": preset, **shapes, "objective": objective, "windows": windows,
                                     "workers": workers, "loader_tokens_per_s": tps, "model_tokens_per_s": model,
                                     "ratio": tps / model})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures["rows"] = rows
    print(f"1 GB shard ({figures['shard_bytes']:,} bytes): written in {figures['write_seconds']:.1f} s; start-up to "
          f"the first batch {figures['startup_seconds'] * 1e3:.1f} ms")
    print(f"model tokens/s: estimated at {args.tflops:g} TFLOP/s × MFU {args.mfu:g} (6N + 6·L·T·d FLOPs a token)")
    print(f"{'preset':<22}{'L×d':>9}{'B×T':>10}{'task':>6}{'windows':>12}{'workers':>8}{'loader tok/s':>15}"
          f"{'model tok/s':>14}{'ratio':>8}")
    for r in rows:
        print(f"{r['preset']:<22}{r['n_layers']:>4}×{r['d_model']:<4}{r['batch_size']:>5}×{r['seq_len']:<4}"
              f"{r['objective']:>6}{r['windows']:>12}{r['workers']:>8}{r['loader_tokens_per_s']:>15,.0f}"
              f"{r['model_tokens_per_s']:>14,.0f}{r['ratio']:>7.1f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
