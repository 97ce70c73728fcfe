"""``python -m harness.bench.cpu_memory``: the memory estimate ``--check --gpu-memory`` prints, against the peak a
training step reaches on this CPU, shape by shape, in fp32 and under bf16 autocast.

The estimate is ``gpu_estimate`` as ``validate`` calls it (``resources.gpu_estimates``). The measure is the
resident set's high-water mark (``VmHWM``) of a fresh process, less its resident set just before the model is
built (Python, torch and the composed config): each shape runs alone in its own process (a process's high-water
mark never comes down), two optimizer steps (the second holds AdamW's moments) of the module's loss on random
ids. Twice: with glibc serving every block above 128 KiB by ``mmap`` and handing it back when freed
(``MALLOC_MMAP_THRESHOLD_``), so the resident set follows the tensors alive — the count a GPU's allocator keeps,
``torch.cuda.max_memory_allocated`` — and as ``run.py`` runs (``harness.allocator.keep_freed_memory``: freed
blocks kept on the heap for the next step), whose resident set is what a CPU run takes, fragmentation included.
The GPU bench (harness/bench/gpu_memory.py) measures the same estimate with the CUDA allocator's own count; this
one needs no GPU, so a change to the formula or the model is checked on any machine. The CPU's attention is
torch's SDPA, a fused kernel here as on a GPU (no T×T weights kept), so the formula's terms hold — except the
logits' under bf16 autocast, where the CPU's cross-entropy holds fewer bytes a logit at its peak than a GPU's
(the formula's, results/bench_gpu/): there the formula is the GPU's and overestimates a CPU
(results/bench_cpu_memory/ has the ratios).

    python -m harness.bench.cpu_memory --out results/bench_cpu_memory
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.markdown import table

# (name, overrides, vocabulary, causal): each measured at both precisions
BASE = ["task=clm", "model.dropout=0.0", "trainer.accelerator=cpu"]
SHAPES: tuple[tuple[str, tuple[str, ...], int, bool], ...] = (
    (
        "blocks: d512 × 4, bytes",
        (
            "model.n_layers=4",
            "model.d_model=512",
            "model.n_heads=8",
            "model.d_ff=2048",
            "data.batch_size=8",
            "data.seq_len=512",
        ),
        258,
        True,
    ),
    (
        "vocabulary 32k, whole logits",
        (
            "model.n_layers=4",
            "model.d_model=256",
            "model.n_heads=4",
            "model.d_ff=1024",
            "data.batch_size=8",
            "data.seq_len=256",
        ),
        32000,
        True,
    ),
    (
        "vocabulary 32k, loss_chunk=256",
        (
            "model.n_layers=4",
            "model.d_model=256",
            "model.n_heads=4",
            "model.d_ff=1024",
            "data.batch_size=8",
            "data.seq_len=256",
            "model.loss_chunk=256",
        ),
        32000,
        True,
    ),
    (
        "modern block d512 × 4, bytes",
        (
            "model=modern",
            "model.n_layers=4",
            "model.d_model=512",
            "model.n_heads=8",
            "data.batch_size=8",
            "data.seq_len=512",
        ),
        258,
        True,
    ),
    (
        "modern block (SwiGLU, RMSNorm, untied), 8k",
        (
            "model=modern",
            "model.n_layers=6",
            "model.d_model=384",
            "model.n_heads=6",
            "model.d_ff=1024",
            "data.batch_size=8",
            "data.seq_len=256",
        ),
        8192,
        True,
    ),
    (
        "encoder (MLM head), post-norm, 16k",
        (
            "task=mlm",
            "model.norm=post",
            "model.n_layers=4",
            "model.d_model=384",
            "model.n_heads=6",
            "model.d_ff=1536",
            "data.batch_size=8",
            "data.seq_len=256",
        ),
        16384,
        False,
    ),
)
PRECISIONS = ("32-true", "bf16-mixed")
TOLERANCE = 0.10  # the bar: measured within ±10 % of the estimate


@dataclass
class Row:
    shape: str
    precision: str
    n_params: int
    tokens: int
    vocab: int
    estimate_mib: float
    states_mib: float
    activations_mib: float
    logits_mib: float
    measured_mib: float  # the tensors' peak (every large block mmap'd, returned when freed)
    ratio: float  # measured ÷ estimate
    resident_mib: float  # the resident set's peak under run.py's allocator (harness/allocator.py)
    resident_ratio: float
    seconds: float


def _status_kib(field: str) -> int:
    return next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith(field + ":")
    )


def measure(index: int, precision: str, steps: int = 2) -> Row:
    """One shape at one precision, in this process (run it in a fresh one: ``child``)."""
    import torch

    from harness.allocator import keep_freed_memory
    from harness.bench.gpu_memory import train_steps
    from harness.bench.internals import compose_cell, composed_model
    from harness.config.resources import gpu_estimates

    keep_freed_memory()
    name, overrides, vocab, causal = SHAPES[index]
    cfg = compose_cell([*BASE, *overrides, f"trainer.precision={precision}"])
    batch, t = int(cfg.data.batch_size), cfg.data.seq_len
    torch.manual_seed(0)
    ids = torch.randint(vocab, (batch, t))
    labels = ids.roll(-1, dims=1) if causal else torch.where(torch.rand(batch, t) < 0.15, ids, -100)
    meta = composed_model(cfg, vocab, causal, "meta")
    est = gpu_estimates(cfg, vocab, t, meta.num_params(), meta.pos)[0]
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    model = composed_model(cfg, vocab, causal, "cpu").train()
    train_steps(cfg, model, ids, labels, steps, bf16=precision == "bf16-mixed")
    measured = (_status_kib("VmHWM") - before) * 1024
    mib = 2**20
    return Row(
        name,
        precision,
        model.num_params(),
        batch * t,
        vocab,
        est.total / mib,
        est.states / mib,
        est.activations / mib,
        est.logits / mib,
        measured / mib,
        measured / est.total,
        float("nan"),
        float("nan"),
        time.perf_counter() - started,
    )


TENSORS = {"POSBENCH_MALLOC": "system", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}  # resident = tensors alive


def child(index: int, precision: str) -> Row:
    """``measure`` in fresh interpreters, whose high-water marks are this shape's alone: the tensors' peak, and
    the resident set's under run.py's allocator."""
    row, resident = (_child(index, precision, env) for env in (TENSORS, {}))
    row.resident_mib, row.resident_ratio = resident.measured_mib, resident.ratio
    return row


def _child(index: int, precision: str, env: dict[str, str]) -> Row:
    code = (
        f"import json, dataclasses; from harness.bench.cpu_memory import measure; "
        f"print(json.dumps(dataclasses.asdict(measure({index}, {precision!r}))))"
    )
    inherited = {k: v for k, v in os.environ.items() if k not in ("POSBENCH_MALLOC", "MALLOC_MMAP_THRESHOLD_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env={**inherited, **env}
    )
    if done.returncode != 0:
        raise RuntimeError(f"{SHAPES[index][0]} at {precision} failed:\n{done.stderr[-2000:]}")
    return Row(**json.loads(done.stdout.strip().splitlines()[-1]))


def render(rows: list[Row], command: str, seconds: float) -> str:
    ratios = [r.ratio for r in rows]
    inside = sum(abs(r - 1) <= TOLERANCE for r in ratios)
    lines = [
        "# CPU memory: `--check --gpu-memory`'s estimate vs the measured peak",
        "",
        f"Command: `{command}` ({seconds:.0f} s on this machine). Estimate: `harness.config.estimates.gpu_estimate` "
        "as `--check` calls it. Measured: the resident set's high-water mark of a fresh process (VmHWM) less its "
        "resident set before the model was built; two optimizer steps of the module's loss on random ids "
        "(harness/bench/cpu_memory.py). *Tensors*: glibc returns every freed block above 128 KiB at once, so the "
        "resident set follows the tensors alive (what `torch.cuda.max_memory_allocated` counts on a GPU). "
        "*run.py's allocator*: freed blocks kept for the next step (harness/allocator.py), fragmentation included "
        "— what a CPU run's resident set reaches.",
        "",
        f"**Tensors: {inside} of {len(rows)} rows within ±{TOLERANCE:.0%} of the estimate, measured ÷ estimate "
        f"{min(ratios):.2f} … {max(ratios):.2f}. Under run.py's allocator: "
        f"{min(r.resident_ratio for r in rows):.2f} … {max(r.resident_ratio for r in rows):.2f}.**",
        "",
        *table(
            [
                "shape",
                "precision",
                "params",
                "tokens",
                "vocab",
                "estimate (MiB)",
                "states / activations / logits",
                "tensors (MiB)",
                "÷ estimate",
                "run.py's allocator (MiB)",
                "÷ estimate",
            ],
            [
                [
                    r.shape,
                    r.precision,
                    f"{r.n_params:,}",
                    f"{r.tokens:,}",
                    f"{r.vocab:,}",
                    f"{r.estimate_mib:,.0f}",
                    f"{r.states_mib:,.0f} / {r.activations_mib:,.0f} / {r.logits_mib:,.0f}",
                    f"{r.measured_mib:,.0f}",
                    f"{r.ratio:.3f}",
                    f"{r.resident_mib:,.0f}",
                    f"{r.resident_ratio:.3f}",
                ]
                for r in rows
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from harness.errors import ConfigError, OneLineParser, said_refusal
    from harness.record.preflight import output_dir

    parser = OneLineParser(prog="python -m harness.bench.cpu_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for README.md and memory.csv (else the table is printed)")
    try:
        args = parser.parse_args(argv)
        if args.out:
            output_dir(args.out, "--out")  # checked before ten processes are measured, not after
    except ConfigError as e:
        return said_refusal(e)
    started = time.perf_counter()
    rows = [child(i, p) for i in range(len(SHAPES)) for p in PRECISIONS]
    command = "python -m harness.bench.cpu_memory" + (f" --out {args.out}" if args.out else "")
    text = render(rows, command, time.perf_counter() - started)
    if args.out:
        from harness.bench.report import write_csv
        from harness.integrity import report_folder

        with report_folder(Path(args.out)) as out:  # written whole or not at all, then sealed
            write_csv(out / "memory.csv", [asdict(r) for r in rows])
            (out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
