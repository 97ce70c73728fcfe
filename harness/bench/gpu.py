"""``python -m harness.bench.gpu --out results/bench_gpu``: what one GPU says about posbench, in one run.

Written for a GPU lent for minutes: every section has a share of ``--deadline-s`` and is skipped,
said so in the report, once the time is spent. In order of value:

1. **memory** — ``--check --gpu-memory``'s figure (``harness.config.estimates.gpu_estimate``, called with what
   ``validate`` passes it) beside ``torch.cuda.max_memory_allocated`` over 20 training steps (bf16-mixed
   autocast, the preset's AdamW, the harness's loss: fp32 cross-entropy of every position's logits) for the
   paper cells of eleuther_rotary (GPT-3 Small, T = 2048, GPT-2's 50,257-token vocabulary) and roformer_mlm
   (BERT-base, T = 512, BERT's 30,522 WordPiece vocabulary) at several batch sizes. Random token ids: memory
   does not depend on the text.
2. **steps** — tokens/s and MFU of a training step (forward + backward, bf16 autocast: harness.bench's cell)
   for none / rope / t5 / alibi with softmax and rope with the other attentions at d768, 12 layers, T = 2048;
   MFU against the run's own measured bf16 matmul peak and against the datasheet's dense bf16 peak.
3. **peers** — the same step of x-transformers and Hugging Face models at the same shape, paired ABBA rounds
   with a 95 % interval of the ratio (harness.bench.targets.compare_peer).
4. **flex** — bias schemes (T5, ALiBi, KERPLE, FIRE) through flex_attention (harness/bench/flex.py): forward
   and gradient parity with the dense path in fp32, then the attention call's forward + backward against
   plain SDPA without a bias (goal ≤ 1.1×), paired.

No MLflow here: the GPU machine this was written for has no mlflow, and the committed report is the record.
Each section writes its CSV as soon as it ends, so a run stopped early still leaves what it measured.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.bench.cells import PEERS, Peer, Spec, x_transformers
from harness.bench.cli import MAX_TOKENS
from harness.bench.flex import attention_steps, parity
from harness.bench.gpu_memory import MEMORY_CELLS, memory_row
from harness.bench.gpu_report import render
from harness.bench.internals import build_transformer, xformers_refusal
from harness.bench.measure import matmul_peak_flops, trim
from harness.bench.report import write_csv
from harness.bench.session import Options, Session, paired_rounds
from harness.bench.stats import Goal
from harness.bench.targets import compare_peer
from harness.errors import ConfigError, OneLineParser, one_line, said_refusal
from harness.ranges import Positive, PositiveInt, at_most
from harness.record.preflight import number, output_dir
from harness.record.run import git_sha

D768 = ("model.n_layers=12", "model.d_model=768", "model.n_heads=12", "model.d_ff=3072")
DATASHEET_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}  # dense, SXM, TFLOP/s
FLEX_GOAL = Goal("<=", 1.1)  # flex step ÷ plain SDPA step


# ---------------------------------------------------------------- steps and peers

STEP_CELLS = (
    ("none", "softmax"),
    ("rope", "softmax"),
    ("t5", "softmax"),
    ("alibi", "softmax"),
    ("rope", "local"),
    ("rope", "performer"),
    ("rope", "linear"),
)
PEER_NAMES = ("x-transformers rotary", "x-transformers T5 bias", "x-transformers ALiBi", "HF RoFormer", "HF BERT")
FLASH_PEERS = (  # x-transformers on torch's SDPA: its defaults materialise the T × T weights (it refuses flash
    # with its T5 bias: "flash attention not compatible with t5 relative positional bias")
    Peer("x-transformers rotary, attn_flash", "rope", "softmax", x_transformers("rotary_pos_emb", flash=True)),
    Peer("x-transformers ALiBi, attn_flash", "alibi", "softmax", x_transformers("alibi_pos_bias", flash=True)),
)


def _step_rows(session: Session, t: int, tokens: int, datasheet: float | None) -> list[dict]:
    results = (
        session.cell(Spec(pos, attn, t, max(1, tokens // t), causal=True, attn_overrides=D768))
        for pos, attn in STEP_CELLS
    )
    return [
        {**asdict(r), "mfu_datasheet": r.flops / r.step_s / datasheet if datasheet and r.ok else None} for r in results
    ]


def _peer_rows(session: Session, t: int, tokens: int, budget_s: float) -> list[dict]:
    outcomes = (
        compare_peer(
            session,
            peer,
            Spec(peer.pos, peer.attn, t, max(1, tokens // t), causal=True, attn_overrides=D768),
            budget_s=budget_s,
        )
        for peer in [*(p for p in PEERS if p.name in PEER_NAMES), *FLASH_PEERS]
    )
    return [
        {
            "peer": o.peer.name,
            "pos": o.peer.pos,
            "attn": o.peer.attn,
            "peer_tokens_per_s": o.theirs.tokens_per_s,
            "posbench_tokens_per_s": o.ours.tokens_per_s,
            "posbench_over_peer": o.interval.estimate if o.interval else None,
            "low": o.interval.low if o.interval else None,
            "high": o.interval.high if o.interval else None,
            "rounds": len(o.interval.samples) if o.interval else 0,
            "note": o.why or o.peer.note,
        }
        for o in outcomes
    ]


# ---------------------------------------------------------------- flex_attention

FLEX_SCHEMES = ("t5", "alibi", "kerple", "fire")


def _flex_rows(device: str, t: int, batch: int, budget_s: float) -> list[dict]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    rows = []
    for name in FLEX_SCHEMES:
        row: dict = {"scheme": name}
        try:
            overrides = [f"pos={name}", *D768, "model.n_layers=1", "model.dropout=0.0", f"data.seq_len={t}"]
            scheme = build_transformer(overrides, 258, t, True).pos.to(device)
            q, k, v = (torch.randn(1, 12, t, 64, device=device) for _ in range(3))
            p = parity(scheme, q, k, v, compiled, create_block_mask)
            row |= {
                "fp32_out_max_abs_err": p.out_err,
                "fp32_grad_max_rel_err": max(p.grad_err.values()),
                "grads_compared": " ".join(sorted(p.grad_err)),
                "note": p.note,
                "grad_errors": " ".join(f"{n}={e:.1e}" for n, e in sorted(p.grad_err.items())),
            }
            row |= _timed(scheme, compiled, create_block_mask, device, t, batch, budget_s)
        except Exception as e:  # a scheme flex cannot take is a finding, not the end of the run
            row["note"] = one_line(f"{type(e).__name__}: {e}")[:300]
        rows.append(row)
        trim(device)
    return rows


# the kernel's tile sizes, tried in turn: torch's defaults first; smaller tiles where the defaults need more
# shared memory than the device has (torch 2.11's bf16 backward on an H200 did: 245,760 > 232,448 bytes)
KERNEL_OPTIONS = (
    None,
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1},
)


def _timed(scheme, compiled, create_block_mask, device: str, t: int, batch: int, budget_s: float) -> dict:
    failures = []
    for options in KERNEL_OPTIONS:
        try:
            steps = attention_steps(
                scheme, batch, 12, t, 64, device, partial(compiled, kernel_options=options), create_block_mask
            )
            for fn in steps.values():  # compile and warm each path once
                fn()
        except Exception as e:
            failures.append(f"{options}: {type(e).__name__}: {str(e).splitlines()[0][:240]}")
            continue
        row: dict = {"kernel_options": str(options or "default"), "kernel_failures": " | ".join(failures)}
        for path in ("flex", "flex_plain", "dense"):
            i = paired_rounds(steps[path], steps["sdpa"], device, FLEX_GOAL, budget_s=budget_s / 3)
            row |= {
                f"{path}_over_sdpa": i.estimate,
                f"{path}_low": i.low,
                f"{path}_high": i.high,
                f"{path}_rounds": len(i.samples),
                f"{path}_verdict": FLEX_GOAL.judge(i),
            }
        return row
    return {"kernel_failures": " | ".join(failures)}


# ---------------------------------------------------------------- CUDA-only checks

BF16_SCHEMES = ("rope", "t5", "alibi", "fire", "xpos")
BF16_STEP = (8, 512)  # (B, T) of the bf16 check's batch


def _cuda_rows(device: str) -> list[dict]:
    """What only a CUDA machine can check: ``attn.backend=xformers`` refused in one line when its wheel does
    not run here, and a training step under bf16 autocast against fp32 (same weights, same batch) per scheme."""
    refusal = xformers_refusal()
    in_one_line = refusal is not None and "\n" not in refusal
    rows: list[dict] = [
        {"check": "attn.backend=xformers", "result": "built: xformers runs here"}
        if refusal is None
        else {
            "check": "attn.backend=xformers",
            "result": f"refused in {'one line' if in_one_line else 'lines'}",
            "ok": in_one_line,
            "detail": refusal,
        }
    ]
    batch, length = BF16_STEP
    for pos in BF16_SCHEMES:
        torch.manual_seed(0)
        model = build_transformer([f"pos={pos}", "model.dropout=0.0", f"data.seq_len={length}"], 258, length, True)
        model.to(device).train()
        ids = torch.randint(258, (batch, length), device=device)
        losses, grads = [], []
        for bf16 in (False, True):
            model.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.roll(-1, 1).flatten())
            loss.backward()
            losses.append(loss.item())
            grads.append(torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None]))
        cos = float(F.cosine_similarity(grads[0], grads[1], dim=0))
        rows.append(
            {
                "check": f"bf16 autocast step, pos={pos}",
                "result": f"loss {losses[1]:.5f} vs fp32 "
                f"{losses[0]:.5f} (rel {abs(losses[1] - losses[0]) / losses[0]:.1e}); gradient cosine {cos:.5f}",
                "ok": abs(losses[1] - losses[0]) / losses[0] < 1e-2 and cos > 0.99,
            }
        )
    return rows


# ---------------------------------------------------------------- the run


def _device_line(device: str) -> tuple[str, float | None]:
    if device != "cuda":
        return f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}", None
    name = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(0)
    return (
        f"{name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs; torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}"
    ), next((v for k, v in DATASHEET_BF16.items() if k in name), None)


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m harness.bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the report folder (README.md, the sections' CSVs, run.log)")
    p.add_argument(
        "--deadline-s", type=number(Positive), default=420.0, help="skip sections once this much time is spent"
    )
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument(
        "--steps", type=number(at_most(PositiveInt, 10_000), int), default=20, help="training steps per memory cell"
    )
    p.add_argument("--length", type=number(at_most(PositiveInt, MAX_TOKENS), int), default=2048)
    p.add_argument(
        "--tokens",
        type=number(at_most(PositiveInt, MAX_TOKENS), int),
        default=32768,
        help="tokens per step of the step/peer cells (at least --length)",
    )
    p.add_argument("--commit", default=None, help="the commit measured, where the copy run has no git history")
    p.add_argument("--render", action="store_true", help="only rewrite README.md from the folder's CSVs")
    return p


def _parse(argv: list[str] | None):
    """The flags, checked before anything is measured: ranges, the sections' names, where the report goes."""
    a = _parser().parse_args(argv)
    if a.render:
        a.out = Path(a.out).expanduser()
        if not a.out.is_dir():
            raise ConfigError(f"--out {a.out} is no folder; --render rewrites README.md from a report folder's CSVs")
        return a
    unknown = set(a.sections.split(",")) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"--sections {','.join(sorted(unknown))}: use some of {','.join(SECTIONS)}")
    if a.tokens < a.length:
        raise ConfigError(f"--tokens {a.tokens} is less than one sequence of --length {a.length}; raise --tokens")
    a.out = output_dir(a.out)
    return a


def main(argv: list[str] | None = None) -> int:
    try:
        a = _parse(argv)
        if a.render:
            render(a.out, check=True)
            return 0
    except ConfigError as e:
        return said_refusal(e)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m harness.bench.gpu", *(argv if argv is not None else sys.argv[1:])])
    where, datasheet = _device_line(device)
    peak = matmul_peak_flops(device, (4096, 8192) if device == "cuda" else (256,), seconds=1.0)
    log = [
        f"device: {where}",
        f"commit: {a.commit or git_sha()}",
        f"command: {command}",
        f"measured bf16 matmul peak: {peak.flops / 1e12:.1f} TFLOP/s at n={peak.n}",
        f"datasheet dense bf16 peak: {datasheet / 1e12:.1f} TFLOP/s" if datasheet else "datasheet peak: unknown",
    ]
    print("\n".join(log), flush=True)
    session = Session(Options(device, peak.flops, peak.n, warmup=2, repeats=10, cell_s=2.0))
    bodies = {
        "memory": lambda budget: [asdict(memory_row(c, b, device, a.steps)) for c in MEMORY_CELLS for b in c.batches],
        "steps": lambda budget: _step_rows(session, a.length, a.tokens, datasheet),
        "peers": lambda budget: _peer_rows(session, a.length, a.tokens, budget_s=min(10.0, budget / 6)),
        "flex": lambda budget: _flex_rows(device, a.length, 8, budget_s=min(16.0, budget / 5)),
        "cuda": lambda budget: _cuda_rows(device),
    }
    _run_sections(bodies, a.sections.split(","), a.deadline_s, a.out, session, log)
    (a.out / "run.log").write_text("\n".join(log) + "\n")
    render(a.out)
    return 0


def _run_sections(
    bodies: dict, chosen: list[str], deadline_s: float, out: Path, session: Session, log: list[str]
) -> None:
    """Each chosen section in order, given the time left; its CSV written as it ends; a failure logged."""
    started = time.perf_counter()
    for name in (s for s in SECTIONS if s in chosen):
        left = deadline_s - (time.perf_counter() - started)
        if left < 20:
            log.append(f"{name}: skipped, the deadline ({deadline_s:.0f} s) was spent")
            continue
        t0 = time.perf_counter()
        try:
            rows = bodies[name](left)
        except Exception as e:  # one broken section must not lose the others' figures
            log.append(f"{name}: failed: {one_line(f'{type(e).__name__}: {e}')[:300]}")
            rows = []
        session.release()
        write_csv(out / f"{name}.csv", rows)  # an empty section writes no file
        log.append(f"{name}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
        print(log[-1], flush=True)
    log.append(f"total: {time.perf_counter() - started:.0f} s")
    print(log[-1])


SECTIONS = ("memory", "steps", "peers", "flex", "cuda")


if __name__ == "__main__":
    sys.exit(main())
