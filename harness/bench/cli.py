"""``python -m harness.bench``: parse and check the flags, run grid, peers and targets, write the report.

Bad input is one line on stderr and exit 2 (nothing measured, nothing written): an unknown --pos/--attn
(the line names the valid options), a malformed, non-positive or out-of-range number (--cell-s=1e300), --device
cuda without CUDA.
Exit 1 when a cell raised (its MLflow run is FAILED), 2 when nothing was measured (no report), else 0.
The report goes to --out (default bench-out/, ignored by git); results/bench/ only when named there.
"""

from __future__ import annotations

import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.bench.cells import PEERS, Spec
from harness.bench.measure import Peak, matmul_peak_flops
from harness.bench.report import Report, write_report
from harness.bench.session import Options, Result, Session
from harness.bench.targets import compare_peer, targets_for
from harness.config.catalog import options
from harness.errors import ConfigError, IncompatiblePairing, OneLineParser, said_refusal
from harness.model.layers import unit_of_label
from harness.paths import project_root
from harness.ranges import NonNegative, Positive, PositiveInt, at_most
from harness.record.preflight import number, output_dir, store_to_write
from harness.record.run import TrackedRun, git_sha

MAX_TOKENS = 2**24  # tokens in a step (and the longest length): 16M, beyond any GPU's activations


@dataclass(frozen=True)
class Args:
    poses: list[str]
    attns: list[str]
    lengths: list[int]
    tokens: int
    model: str
    warmup: int
    repeats: int
    cell_s: float
    budget_s: float
    peers: bool
    targets: bool
    device: str
    out: Path
    tracking_uri: str  # resolved and checked
    causal: bool = False  # the grid's cells with a causal mask (a causal-only scheme, FoX, refuses the other)


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m harness.bench", description="Benchmarks: what each pos × attn cell costs.")
    # the grid's default is pos=none, so the default run stays short on a laptop; RoPE's and T5's cost
    # are measured by the targets (and the peers) against pos=none. --pos none,rope,t5 for the full grid.
    p.add_argument("--pos", default="none", help="comma list of conf/pos options or per-layer patterns (rope×3+none)")
    p.add_argument(
        "--attn", default="all", help="comma list of conf/attn options or patterns (local×3+softmax), or 'all'"
    )
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument(
        "--tokens",
        type=number(at_most(PositiveInt, MAX_TOKENS), int),
        default=None,
        help="tokens per step (batch = tokens / length); default 8192 on CPU, 65536 on CUDA",
    )
    p.add_argument("--model", default="small", help="conf/model preset")
    p.add_argument(
        "--warmup",
        type=number(at_most(NonNegative, 1000), int),
        default=0,
        help="untimed steps after the (untimed) FLOP-counting step",
    )
    p.add_argument(
        "--repeats", type=number(at_most(PositiveInt, 1000), int), default=3, help="most timed steps per cell"
    )
    p.add_argument(
        "--cell-s",
        type=number(at_most(Positive, 86_400)),  # a day: beyond any bench's cell
        default=5.0,
        help="stop timing a cell once its timed steps add up to this many seconds (at least one)",
    )
    p.add_argument(
        "--budget-s",
        type=number(at_most(Positive, 86_400)),
        default=12.0,
        help="skip longer lengths of a cell once one step takes longer than this",
    )
    p.add_argument(
        "--causal",
        action="store_true",
        help="the grid's cells as causal LMs (the default is bidirectional, as task=mlm)",
    )
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--no-targets", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--out",
        default=str(project_root() / "bench-out"),
        help="report folder (default bench-out/; "
        "results/bench/ holds the committed report and is written only when named here)",
    )
    p.add_argument("--tracking-uri", default=None, help="default: as run.py ($MLFLOW_TRACKING_URI or ./mlflow.db)")
    return p


def parse(argv: list[str] | None) -> Args:
    a = _parser().parse_args(argv)
    out, uri = output_dir(a.out, "--out"), store_to_write(a.tracking_uri)  # checked before minutes of measuring
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device cuda: no CUDA device here (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); use --device cpu, or install a CUDA build of torch"
        )
    return Args(
        _options(a.pos, "pos"),
        list(options("attn", need_target=False)) if a.attn == "all" else _options(a.attn, "attn"),
        _lengths(a.lengths),
        a.tokens or (65536 if a.device == "cuda" else 8192),
        _model(a.model),
        a.warmup,
        a.repeats,
        a.cell_s,
        a.budget_s,
        not a.no_peers,
        not a.no_targets,
        a.device,
        out,
        uri,
        a.causal,
    )


def _options(text: str, group: str) -> list[str]:
    """Option names, or per-layer patterns by name (``rope×3+none``: harness/model/layers.py)."""
    chosen, valid = [x for x in text.split(",") if x], options(group, need_target=False)
    unknown = [x for x in chosen if not {entry.partition("(")[0] for entry in unit_of_label(x)} <= set(valid)]
    if unknown or not chosen:
        named = ",".join(unknown) or repr(text)
        raise ConfigError(f"--{group} {named}: not in conf/{group}/; valid: {', '.join(valid)}")
    return chosen


def _model(name: str) -> str:
    """One conf/model option (the grid's every cell has the same model)."""
    valid = options("model", need_target=False)
    if name not in valid:
        raise ConfigError(f"--model {name!r}: not in conf/model/; valid: {', '.join(valid)}")
    return name


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--lengths {text!r}: use a comma list of positive integers, e.g. 512,1024") from None
    if any(t <= 0 for t in lengths):
        raise ConfigError(f"--lengths {text!r}: every length must be positive")
    if max(lengths) > MAX_TOKENS:
        raise ConfigError(f"--lengths {text!r}: every length must be at most {MAX_TOKENS:,} tokens")
    return lengths


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        return said_refusal(e)
    command = " ".join(["python -m harness.bench", *(argv if argv is not None else sys.argv[1:])])
    report = run(args, command)
    rows = report.rows()
    if not any(r.ok for r in rows):
        return said_refusal("nothing was measured (every cell was refused or failed); no report written")
    write_report(args.out, report)
    _log_results(args.tracking_uri, rows, report.peak, args.device, report.commit)
    errors = [r for r in rows if r.status == "error"]
    print(
        f"done in {report.seconds:.0f} s; report in {args.out}"
        + (f"; {len(errors)} cell(s) failed (see the report)" if errors else "")
    )
    return 1 if errors else 0


def run(args: Args, command: str) -> Report:
    started, commit = time.perf_counter(), git_sha()
    peak = matmul_peak_flops(args.device, (4096, 8192) if args.device == "cuda" else (2048, 4096))
    print(
        f"peak {'bf16' if args.device == 'cuda' else 'fp32'} matmul: {peak.flops / 1e9:,.1f} GFLOP/s at "
        f"n={peak.n}; {torch.get_num_threads()} threads"
    )
    session = Session(Options(args.device, peak.flops, peak.n, args.warmup, args.repeats, args.cell_s))
    grid = [r for pos in args.poses for attn in args.attns for r in _lengths_of(session, args, pos, attn)]
    peers = [
        compare_peer(
            session, p, Spec(p.pos, p.attn, args.lengths[0], max(1, args.tokens // args.lengths[0]), args.model)
        )
        for p in PEERS
        if args.peers
    ]
    for p in peers:
        shown = f"{p.interval.estimate:.2f} [{p.interval.low:.2f}, {p.interval.high:.2f}]" if p.interval else "—"
        print(f"  posbench ÷ {p.peer.name}: {shown}, {p.verdict}", flush=True)
    targets = [t.evaluate(session) for t in targets_for(args.device, args.tokens) if args.targets]
    for o in targets:
        print(f"  target {o.label}: {o.verdict} ({o.method})", flush=True)
    return Report(grid, peers, targets, peak, args.device, time.perf_counter() - started, command, commit)


def _lengths_of(session: Session, args: Args, pos: str, attn: str) -> list[Result]:
    """One cell per length, shortest first; once one fails or exceeds --budget-s the longer are skipped."""
    results: list[Result] = []
    for T in args.lengths:
        batch = max(1, args.tokens // T)
        if results and (not results[-1].ok or results[-1].step_s > args.budget_s):
            why = "a shorter length already failed or exceeded --budget-s"
            results.append(Result("posbench", pos, attn, T, batch, status="skipped", reason=why))
        else:
            results.append(session.cell(Spec(pos, attn, T, batch, args.model, causal=args.causal)))
    return results


class CellFailed(Exception):
    """Raised inside a cell's MLflow run so that the run ends FAILED with the cell's reason."""


def _log_results(uri: str, results: list[Result], peak: Peak, device: str, sha: str) -> None:
    """One MLflow run per measured cell in experiment ``bench`` of the store at ``uri`` (resolved and checked by
    ``parse``), tagged with a shared bench_id and the commit measured (``sha``): FINISHED for status ok, else
    FAILED with tags ``failure`` (incompatible for a refused cell, error for one that raised) and
    ``failure_reason``. The run's owner (``TrackedRun``) sets its status from whether its body raised."""
    import uuid

    from mlflow.entities import Metric

    bench_id = uuid.uuid4().hex[:12]
    for r in (r for r in results if r.status != "skipped"):
        tags = {
            "kind": "peer" if r.name != "posbench" else "posbench",
            "impl": r.name,
            "pos": r.pos,
            "attn": r.attn,
            "bench_id": bench_id,
            "git_sha": sha,
            "device": device,
            "status": r.status,
        }
        params = {"seq_len": str(r.seq_len), "batch": str(r.batch), "peak_flops": f"{peak.flops:.4g}"}
        now = int(time.time() * 1000)
        # raised to record the run FAILED with the reason, then dropped: the bench's exit code reports errors
        with (
            suppress(CellFailed, IncompatiblePairing),
            TrackedRun(uri, "bench", f"{r.name} pos={r.pos} attn={r.attn} T={r.seq_len}").open(tags, params) as run,
        ):
            run.log_metrics(Metric(k, v, now, 0) for k, v in vars(r).items() if isinstance(v, float) and v == v)
            if r.status == "refused":
                raise IncompatiblePairing(r.reason)
            if r.status != "ok":
                raise CellFailed(r.reason)
