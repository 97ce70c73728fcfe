"""A round of hostile inputs, as issue 44's rounds were run: new inputs aimed at the surfaces added since the last
round (loss chunks, document splits, sealed shards and records, the sweep's α, DDP slices, accumulation, the
1.4B scale, the loader's --shards, the CPU memory bench, results under faults), each a real process in a fresh
folder with a fresh store, classified by what the user sees:

  one line    exit 2 (or 1 for a fault), one stderr line starting "error: ", no traceback
  accepted    exit 0
  traceback   a Python traceback on stderr
  weak        anything else: another exit code, several lines, a line that names no fix
  hang        no answer within the timeout

    python tools/hostile_round.py            # ~5 min on 2 cores; prints the table and the counts

Each try states what it expects (refused, or accepted); the last line counts the tries whose outcome differs.
Not part of the suite (the bad-input table is: tests/unit/test_bad_input.py); a round to re-run after a change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
QUICK = ["trainer.max_steps=2", "trainer.val_check_interval=2", "data.eval_batches=1", "model.n_layers=1",
         "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "data.batch_size=4", "data.seq_len=32"]


def _fixtures(d: Path) -> None:
    """Inputs the tries point at: shards, damaged shards and records, a parquet, a small text."""
    sys.path.insert(0, str(ROOT))
    from harness.main import prepare_shards as prepare

    (d / "words.txt").write_bytes(b"alpha beta gamma delta " * 4600)
    prepare(d / "shards", ["data=text", f"data.path={d / 'words.txt'}"])
    (d / "few.txt").write_bytes(b"alpha beta gamma delta " * 400)  # 9 KB: shards smaller than a paper batch
    prepare(d / "tiny", ["data=text", f"data.path={d / 'few.txt'}", "data.source.val_every=2"])
    for name, damage in (("flipped", "shard"), ("edited", "manifest")):
        target = d / name
        subprocess.run(["cp", "-r", str(d / "shards"), str(target)], check=True)
        if damage == "shard":
            data = bytearray((target / "train-00000.bin").read_bytes())
            data[1001] ^= 1
            (target / "train-00000.bin").write_bytes(bytes(data))
        else:
            text = (target / "manifest.json").read_text()
            (target / "manifest.json").write_text(text.replace('"tokens": ', '"tokens":  ', 1).replace(
                "words.txt", "other.txt"))
    (d / "a_file").write_text("x")
    (d / "emptydir").mkdir()
    run_dir = d / "rundir"
    run_dir.mkdir()
    (run_dir / "run.json").write_text('{"run_id": "x", "config_hash": "0", "tracking_uri": "", "experiment": "",'
                                      ' "sha256": "0000"}')


def tries(d: Path) -> list[tuple[str, list[str], str]]:
    """(name, argv, expected: "refused" or "accepted")."""
    run = [PY, str(ROOT / "run.py")]
    check = [*run, "--check"]
    prep = [PY, "run.py", "prepare"]
    results = [PY, "-m", "results"]
    loader = [PY, "-m", "harness.bench.loader"]
    return [
        # model.loss_chunk
        ("loss_chunk negative", [*check, "model.loss_chunk=-1"], "refused"),
        ("loss_chunk a word", [*check, "model.loss_chunk=many"], "refused"),
        ("loss_chunk a list", [*check, "model.loss_chunk=[1,2]"], "refused"),
        ("loss_chunk huge", [*check, "model.loss_chunk=1000000000"], "accepted"),
        ("loss_chunk trains", [*run, *QUICK, "model.loss_chunk=7"], "accepted"),
        # report.alpha
        ("alpha zero", [*check, "report.alpha=0"], "refused"),
        ("alpha above one", [*check, "report.alpha=1.5"], "refused"),
        ("alpha a word", [*check, "report.alpha=strict"], "refused"),
        ("alpha nan", [*check, "report.alpha=nan"], "refused"),
        # data.val_by / document split
        ("val_by on embedded", [*check, "data.val_by=block"], "refused"),
        ("val_by unknown", [*check, "data=hf", f"data.path={d / 'words.txt'}", "data.val_by=rows"], "refused"),
        ("val_every one", [*check, "data=hf", f"data.path={d / 'words.txt'}", "data.source.val_every=1"],
         "refused"),
        # accumulation and scales
        ("accumulate zero", [*check, "trainer.accumulate_grad_batches=0"], "refused"),
        ("accumulate negative", [*check, "trainer.accumulate_grad_batches=-2"], "refused"),
        ("accumulate huge", [*check, "trainer.accumulate_grad_batches=99999999999999999999"], "refused"),
        ("1b4 on another preset", [*run, "-m", "experiment=rope_scaling", "scale=paper_1b4"], "refused"),
        ("1b4 on the byte vocabulary", [*check, "experiment=eleuther_rotary", "scale=paper_1b4", "pos=rope",
                                        "seed=0"], "refused"),
        # shards: sealed, per-rank
        ("a flipped shard", [*check, "data=tokens", f"data.path={d / 'flipped'}"], "refused"),
        ("an edited manifest", [*check, "data=tokens", f"data.path={d / 'edited'}"], "refused"),
        ("shards path a file", [*check, "data=tokens", f"data.path={d / 'a_file'}"], "refused"),
        ("shards path empty dir", [*check, "data=tokens", f"data.path={d / 'emptydir'}"], "refused"),
        ("ddp slice too short", [*check, "trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu",
                                 "data=tokens", f"data.path={d / 'shards'}", "data.seq_len=60000",
                                 "data.batch_size=1"], "refused"),
        ("ddp zero devices", [*check, "trainer=ddp", "trainer.devices=0", "trainer.accelerator=cpu"], "refused"),
        # a damaged run record beside checkpoints
        ("resume from a damaged run.json", [*run, *QUICK, f"hydra.run.dir={d / 'rundir'}", "resume=true"],
         "refused"),
        # prepare
        ("prepare no folder", [*prep], "refused"),
        ("prepare into a file", [*prep, str(d / "a_file"), "data=embedded"], "refused"),
        ("prepare under /proc", [*prep, "/proc/posbench", "data=embedded"], "refused"),
        ("prepare shard-tokens zero", [*prep, str(d / "p1"), "--shard-tokens", "0"], "refused"),
        ("prepare shard-tokens word", [*prep, str(d / "p2"), "--shard-tokens", "many"], "refused"),
        ("prepare from shards", [*prep, str(d / "p3"), "data=tokens", f"data.path={d / 'shards'}"], "refused"),
        ("prepare val_by unknown", [*prep, str(d / "p4"), "data=hf", f"data.path={d / 'words.txt'}",
                                    "data.val_by=x"], "refused"),
        ("prepare tiny vocabulary", [*prep, str(d / "p5"), "tokenizer=bpe", "tokenizer.vocab_size=1"], "refused"),
        # results
        ("results out under /proc", [*results, "report", "--out", "/proc/posbench"], "refused"),
        ("results unknown preset", [*results, "paper", "--preset", "nope"], "refused"),
        ("results scale the preset lacks", [*results, "paper", "--preset", "alibi_extrapolation", "--scale",
                                            "paper_1b4"], "refused"),
        ("results index on a file", [*results, "index", "--dir", str(d / "a_file")], "refused"),
        ("results store missing", [*results, "report", "--out", str(d / "r1"), "--tracking-uri",
                                   f"sqlite:///{d / 'nope' / 'x.db'}"], "refused"),
        ("results baseline empty", [*results, "report", "--out", str(d / "r2"), "--baseline", ""], "refused"),
        # the loader bench's --shards
        ("loader shards a file", [*loader, "--shards", str(d / "a_file")], "refused"),
        ("loader shards flipped", [*loader, "--shards", str(d / "flipped"), "--presets", "grid"], "refused"),
        ("loader shards and gb", [*loader, "--shards", str(d / "shards"), "--gb", "1"], "refused"),
        ("loader shards too small", [*loader, "--shards", str(d / "tiny")], "refused"),
        ("loader shards ok", [*loader, "--shards", str(d / "shards"), "--presets", "grid", "--batches", "2",
                              "--repeats", "1"], "accepted"),
        # the CPU memory bench
        ("cpu memory out under /proc", [PY, "-m", "harness.bench.cpu_memory", "--out", "/proc/posbench"],
         "refused"),
        ("cpu memory unknown flag", [PY, "-m", "harness.bench.cpu_memory", "--shapes", "3"], "refused"),
    ]


def classify(proc: subprocess.CompletedProcess | None) -> str:
    if proc is None:
        return "hang"
    if "Traceback" in proc.stderr:
        return "traceback"
    if proc.returncode == 0:
        return "accepted"
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "INFO mlflow" not in line]
    if proc.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
        return "one line"
    return "weak"


def main() -> int:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="posbench-round-") as tmp:
        d = Path(tmp)
        _fixtures(d)
        rows, counts, misses = [], {}, 0
        for i, (name, argv, expected) in enumerate(tries(d)):
            cwd = d / f"try{i}"
            cwd.mkdir()
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}", "POSBENCH_CACHE":
                   str(d / "cache"), "OMP_NUM_THREADS": "1"}
            try:
                proc = subprocess.run(argv, cwd=ROOT if argv[1] == "-m" else cwd, env=env, capture_output=True,
                                      text=True, timeout=300)
            except subprocess.TimeoutExpired:
                proc = None
            got = classify(proc)
            counts[got] = counts.get(got, 0) + 1
            ok = (got == "one line") if expected == "refused" else (got == "accepted")
            misses += not ok
            said = "" if proc is None else (proc.stderr.strip().splitlines() or [""])[-1][:150]
            rows.append(f"| {name} | {expected} | {got}{'' if ok else ' ✗'} | {said} |")
            print(rows[-1], flush=True)
    print(f"\n{len(rows)} tries in {time.perf_counter() - started:.0f} s: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f"; {misses} not as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
