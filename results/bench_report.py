"""Writes the benchmark report: README.md (tables, targets), bench.csv and log-log plots."""

from __future__ import annotations

import csv
import platform
from dataclasses import asdict
from pathlib import Path

import torch


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"{_cpu_name()}, {torch.get_num_threads()} threads"


def _fmt(r, key: str, scale: float = 1.0, spec: str = ",.1f") -> str:
    v = getattr(r, key)
    return "—" if r.status != "ok" or v != v else format(v * scale, spec)


def _failure(ours, theirs) -> str:
    """Why a peer comparison has no ratio: whichever side did not run (either may have failed)."""
    failed = [r for r in (ours, theirs) if r.status != "ok"]
    return "; ".join(f"{r.name} {r.status}: {r.reason[:60]}" for r in failed)


def write_report(out: Path, grid, peers, targets, *, peak: float, peak_n: int, device: str, seconds: float, command: str) -> None:
    from harness.record.run import git_sha

    out.mkdir(parents=True, exist_ok=True)
    from harness.bench import unique

    rows = unique(grid + [r for pair in peers for r in pair[:2]] + [c for _, cells, *_ in targets for c in cells.values()])
    with open(out / "bench.csv", "w", newline="") as f:
        fields = [k for k in asdict(rows[0]) if k != "extra"] if rows else []
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    _plots(out, grid, device)

    lines = [
        "# Benchmark: cost of each scheme × attention cell",
        "",
        f"Regenerate: `{command}` (took {seconds:.0f} s).",
        "",
        f"Device: {_device_name(device)}. torch {torch.__version__}, commit {git_sha()}. "
        f"Measured peak (best {'bf16' if device == 'cuda' else 'fp32'} square matmul, n = {peak_n}): {peak / 1e9:,.1f} GFLOP/s.",
        "",
        "Step = forward + backward with a cross-entropy loss, median of the timed repeats (up to --repeats, fewer "
        "for long cells: see the `repeats` column of bench.csv) after an untimed FLOP-counting step; tokens per step "
        "held constant across lengths (batch = tokens / T). Memory = peak RSS increase during the timed steps "
        "(CPU) or max allocated (GPU). FLOPs counted by `torch.utils.flop_counter.FlopCounterMode` (matmul, "
        "bmm and SDPA ops from their shapes; elementwise and FFT work not counted). MFU = FLOPs / step time / peak.",
        "",
        "![step time](step_time.png) ![memory](memory.png)",
        "",
        "## Grid",
        "",
        "| pos | attn | T | batch | step (ms) | tokens/s | peak mem (MB) | GFLOP/step | MFU | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in grid:
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason[:80]}"
        lines.append(f"| {r.pos} | {r.attn} | {r.seq_len} | {r.batch} | {_fmt(r, 'step_s', 1e3)} | "
                     f"{_fmt(r, 'tokens_per_s', 1, ',.0f')} | {_fmt(r, 'peak_mem_mb')} | "
                     f"{_fmt(r, 'flops', 1e-9, ',.2f')} | {_fmt(r, 'mfu', 100, '.1f')}{'%' if r.status == 'ok' else ''} "
                     f"| {status} |")
    if peers:
        lines += ["", f"## Peers (same shape, T = {peers[0][0].seq_len}, same process)", "",
                  "tokens/s columns: each side's own timed steps. posbench ÷ peer: paired like the targets below "
                  "(peer step / posbench step, back to back in alternating order; median of the listed rounds).", "",
                  "| peer | posbench cell | peer tokens/s | posbench tokens/s | posbench ÷ peer | goal ≥ 1.2 | paired rounds |",
                  "|---|---|---:|---:|---:|---|---|"]
        for ours, theirs, ratio, ratios in peers:
            lines.append(f"| {theirs.name} | pos={ours.pos} attn={ours.attn} | {_fmt(theirs, 'tokens_per_s', 1, ',.0f')} "
                         f"| {_fmt(ours, 'tokens_per_s', 1, ',.0f')} | {f'{ratio:.2f}' if ratio else '—'} | "
                         f"{('met' if ratio >= 1.2 else 'not met') if ratio else _failure(ours, theirs)} | "
                         f"{', '.join(f'{x:.3f}' for x in ratios) or '—'} |")
    if targets:
        lines += ["", "## Targets", "",
                  "Ratios of two step times are paired: the two models are timed back to back in alternating "
                  "order for several rounds and the median round's ratio is reported (the rounds are listed), "
                  "so load drifting during the run does not land on one side.", "",
                  "| target | goal | measured | verdict | paired rounds |", "|---|---|---:|---|---|"]
        for target, cells, value, ratios in targets:
            rounds = ", ".join(f"{x:.3f}" for x in ratios) or "—"
            if value is None:
                why = "; ".join(f"{k}: {c.reason[:60]}" for k, c in cells.items() if c.status != "ok")
                lines.append(f"| {target.label} | {target.goal} | — | not measured ({why}) | — |")
            else:
                shown = f"{value:.1%}" if "%" in target.goal else f"{value:.2f}"
                lines.append(f"| {target.label} | {target.goal} | {shown} | "
                             f"{'met' if target.ok(value) else 'not met'} | {rounds} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


def _plots(out: Path, grid, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in grid if r.status == "ok"]
    attns = sorted({r.attn for r in ok})
    poses = sorted({r.pos for r in ok})
    colours = dict(zip(attns, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(poses, ["-", "--", ":", "-."] * 4))
    for key, label, fname in (("step_s", "step time (s, forward + backward)", "step_time.png"),
                              ("peak_mem_mb", "peak memory increase (MB)", "memory.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for attn in attns:
            for pos in poses:
                pts = sorted((r.seq_len, getattr(r, key)) for r in ok if r.attn == attn and r.pos == pos)
                pts = [(x, y) for x, y in pts if y > 0]
                if pts:
                    ax.plot(*zip(*pts), styles[pos], marker="o", color=colours[attn], label=f"{attn} · pos={pos}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (tokens; tokens per step held constant)")
        ax.set_ylabel(label)
        ax.set_title(f"posbench: {label.split(' (')[0]} vs length ({device})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)
