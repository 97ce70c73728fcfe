"""Writes the benchmark report: README.md (grid, peers, targets with intervals), bench.csv and plots."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from harness import allocator
from harness.bench.measure import Peak
from harness.bench.profiled import KERNEL_OPS, Breakdown
from harness.bench.session import Result
from harness.bench.stats import Interval
from harness.bench.targets import Outcome, PeerOutcome
from harness.integrity import report_folder
from harness.markdown import csv_text, table


@dataclass
class Report:
    grid: list[Result]
    peers: list[PeerOutcome]
    targets: list[Outcome]
    peak: Peak
    device: str
    seconds: float
    command: str
    commit: str  # git describe when the run started (writing the report dirties a tracked --out)

    def rows(self) -> list[Result]:
        """Each measured cell once, in first-seen order (a cell may appear in grid, peers and targets)."""
        cells = [
            *self.grid,
            *(r for p in self.peers for r in (p.ours, p.theirs)),
            *(r for t in self.targets for r in t.cells.values()),
        ]
        return list({id(r): r for r in cells}.values())


def _cpu_name() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def _fmt(r: Result, key: str, scale: float = 1.0, spec: str = ",.1f") -> str:
    v = getattr(r, key)
    return "—" if not r.ok or v != v else format(v * scale, spec)


def _interval(i: Interval | None, fmt) -> tuple[str, str]:
    if i is None:
        return "—", "—"
    return fmt(i.estimate), (fmt(i.low) if i.low == i.high else f"[{fmt(i.low)}, {fmt(i.high)}]")


def write_csv(path: Path, rows: list[dict]) -> None:
    """The rows under a column for every key any of them has; no rows, no file."""
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        path.write_text(csv_text(keys, ([r.get(k) for k in keys] for r in rows)), newline="")


def write_report(folder: Path, report: Report) -> None:
    """README.md, bench.csv and the plots into ``folder``, written whole or not at all and sealed."""
    with report_folder(folder) as out:
        write_csv(out / "bench.csv", [asdict(r) for r in report.rows()])
        _plots(out, report.grid, report.device)
        lines = [
            *_header(report),
            *_grid(report.grid),
            *_peers(report.peers),
            *_targets(report.targets),
            *_where(report),
        ]
        (out / "README.md").write_text("\n".join(lines) + "\n")


def _header(report: Report) -> list[str]:
    kind = "bf16" if report.device == "cuda" else "fp32"
    device = (
        f"{torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
        if report.device == "cuda"
        else f"{_cpu_name()}, {torch.get_num_threads()} threads"
    )
    return [
        "# Benchmark: cost of each scheme × attention cell",
        "",
        f"Regenerate: `{report.command}` (took {report.seconds:.0f} s).",
        "",
        f"Device: {device}. torch {torch.__version__}, commit {report.commit}. Measured peak "
        f"(best {kind} square matmul, n = {report.peak.n}): {report.peak.flops / 1e9:,.1f} GFLOP/s. "
        f"Allocator: {allocator.setting()} (harness/allocator.py).",
        "",
        "Step = forward + backward with a cross-entropy loss, median of the timed repeats (up to --repeats, fewer "
        "for long cells: the `repeats` column of bench.csv) after an untimed FLOP-counting step; tokens per step "
        "held constant across lengths (batch = tokens / T). Memory = peak bytes of the tensors one step allocates "
        "above those alive before it (CPU: torch.profiler's allocation events; GPU: max allocated), which does "
        "not drift with the allocator; bench.csv also has the RSS increase (`rss_delta_mb`). FLOPs counted by "
        "`torch.utils.flop_counter.FlopCounterMode` (matmul, bmm and SDPA ops from their shapes; elementwise "
        "and FFT work not counted). MFU = FLOPs / step time / peak.",
        "",
        "![step time](step_time.png) ![memory](memory.png)",
        "",
    ]


def _grid(grid: list[Result]) -> list[str]:
    header = ["pos", "attn", "T", "batch", "step (ms)", "tokens/s", "peak mem (MB)", "GFLOP/step", "MFU", "status"]
    rows = [
        [
            r.pos,
            r.attn,
            str(r.seq_len),
            str(r.batch),
            _fmt(r, "step_s", 1e3),
            _fmt(r, "tokens_per_s", 1, ",.0f"),
            _fmt(r, "peak_mem_mb"),
            _fmt(r, "flops", 1e-9, ",.2f"),
            f"{_fmt(r, 'mfu', 100, '.1f')}{'%' if r.ok else ''}",
            r.status if r.ok else f"{r.status}: {r.reason[:80]}",
        ]
        for r in grid
    ]
    return ["## Grid", "", *table(header, rows, "llrrrrrrrl")]


def _peers(peers: list[PeerOutcome]) -> list[str]:
    if not peers:
        return []
    lines = [
        "",
        f"## Peers (same shape, T = {peers[0].ours.seq_len}, same process)",
        "",
        "posbench ÷ peer = peer step / posbench step: the median of ABBA rounds (the two timed back to back "
        "in alternating order) with its distribution-free 95 % interval (order statistics, 6 rounds or more), "
        "run until the interval is on one side of 1.2 or the rounds' budget is spent; the verdict is met only "
        "when the whole interval is ≥ 1.2. The tokens/s columns are each cell's own timed steps, measured "
        "apart before the rounds (a drifting machine moves them; the rounds cancel it). GFLOP columns show "
        "where a peer does "
        "different work at the same shape (notes below). Ceiling: posbench ÷ peer if every op of posbench's "
        "step other than its matrix-multiply and fused-attention kernels took no time (their share of the "
        "step profiled after the rounds, CPU only); below 1.2, no fusion of the other ops can meet the goal "
        "at this shape: only faster kernels or less work could.",
        "",
    ]
    header = [
        "peer",
        "posbench cell",
        "peer tokens/s",
        "posbench tokens/s",
        "peer / posbench GFLOP",
        "posbench ÷ peer",
        "95 % interval",
        "goal ≥ 1.2",
        "rounds",
        "ceiling",
    ]
    rows = [
        [
            p.peer.name,
            f"pos={p.ours.pos} attn={p.ours.attn}",
            _fmt(p.theirs, "tokens_per_s", 1, ",.0f"),
            _fmt(p.ours, "tokens_per_s", 1, ",.0f"),
            f"{_fmt(p.theirs, 'flops', 1e-9, ',.1f')} / {_fmt(p.ours, 'flops', 1e-9, ',.1f')}",
            *_interval(p.interval, lambda x: f"{x:.2f}"),
            p.verdict if p.interval is not None else f"not measured ({p.why})",
            str(len(p.interval.samples)) if p.interval else "—",
            "—" if p.ceiling is None else f"{p.ceiling:.2f} ({p.kernel_share:.0%} kernels)",
        ]
        for p in peers
    ]
    notes = [f"- {p.peer.name}: {p.peer.note}" for p in peers if p.peer.note]
    return [*lines, *table(header, rows, "llrrrrllrr"), *(["", *notes] if notes else [])]


def _targets(targets: list[Outcome]) -> list[str]:
    if not targets:
        return []
    rows = [
        [t.label, str(t.goal), *_interval(t.interval, t.goal.format), t.verdict, t.method, t.check or "—"]
        for t in targets
    ]
    return [
        "",
        "## Targets",
        "",
        "Each target reports its 95 % interval (paired step-time ratios and MFU: the median of the rounds "
        "with its order-statistic interval, harness/bench/stats.py); the verdict is met only when the whole "
        "interval satisfies the goal, not met when none of it does, unresolved when it straddles the goal.",
        "",
        *table(["target", "goal", "measured", "95 % interval", "verdict", "how", "check"], rows, "llrllll"),
    ]


def _where(report: Report) -> list[str]:
    """For each peer or paired target not met: its two steps profiled op by op (CPU)."""
    shown = [(f"posbench ÷ {p.peer.name}", p.verdict, p.where) for p in report.peers if p.where] + [
        (t.label, t.verdict, t.where) for t in report.targets if t.where
    ]
    if not shown:
        return []
    lines = [
        "",
        "## Where the time goes (what is not met)",
        "",
        "Each comparison whose verdict is not met, its two warm steps profiled after the rounds "
        "(torch.profiler, self time per step; 4 steps each, one at a time in ABBA order, each op's median): "
        "the ops whose times differ most, and how "
        "much the side that has to get faster must lose to meet the goal at these times. Kernel = a "
        "matrix-multiply or fused-attention op (the peers table's ceiling counts only these).",
    ]
    for label, verdict, b in shown:
        rows = [
            *([f"`{r.op}`", "kernel" if r.op in KERNEL_OPS else "other", *_ms(r.num_s, r.den_s)] for r in b.rows),
            [b.other.op, "—", *_ms(b.other.num_s, b.other.den_s)],
            ["**step**", "—", *_ms(b.num_s, b.den_s)],
        ]
        lines += [
            "",
            f"### {label}: {verdict}",
            "",
            _cut(b),
            "",
            *table(["op", "kind", f"{b.num} (ms)", f"{b.den} (ms)", "difference (ms)"], rows, "llrrr"),
        ]
    return lines


def _ms(num_s: float, den_s: float) -> list[str]:
    """A breakdown row's three times: each side's and their difference, in ms."""
    return [f"{num_s * 1e3:.1f}", f"{den_s * 1e3:.1f}", f"{(num_s - den_s) * 1e3:+.1f}"]


def _cut(b: Breakdown) -> str:
    ratio = b.num_s / max(b.den_s, 1e-12)
    side_s = b.num_s if b.side == b.num else b.den_s
    goal = f"{'≤' if b.goal_op == '<=' else '≥'} {b.goal:g}"
    if b.cut_s == 0:
        return (
            f"Profiled, {b.num} ÷ {b.den} = {ratio:.2f}, within {goal} at these times: the paired rounds' "
            "interval straddles the goal, so more rounds (a quieter machine) would decide it."
        )
    return (
        f"Profiled, {b.num} ÷ {b.den} = {ratio:.2f}; for {goal} the {b.side} step must lose "
        f"{b.cut_s * 1e3:.1f} ms of {side_s * 1e3:.1f} ({b.cut_s / side_s:.0%})."
    )


def _plots(out: Path, grid: list[Result], device: str) -> None:
    import matplotlib
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global figures

    ok = [r for r in grid if r.ok]
    attns, poses = sorted({r.attn for r in ok}), sorted({r.pos for r in ok})
    colours = dict(zip(attns, matplotlib.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    styles = dict(zip(poses, ["-", "--", ":", "-."] * 4, strict=False))
    for key, label, fname in (
        ("step_s", "step time (s, forward + backward)", "step_time.png"),
        ("peak_mem_mb", "peak allocated memory (MB)", "memory.png"),
    ):
        fig = Figure(figsize=(7, 4.5))
        ax = fig.subplots()
        for attn in attns:
            for pos in poses:
                pts = sorted(
                    (r.seq_len, getattr(r, key)) for r in ok if r.attn == attn and r.pos == pos and getattr(r, key) > 0
                )
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        styles[pos],
                        marker="o",
                        color=colours[attn],
                        label=f"{attn} · pos={pos}",
                    )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="sequence length T (tokens; tokens per step held constant)",
            ylabel=label,
            title=f"posbench: {label.split(' (')[0]} vs length ({device})",
        )
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
