"""Forward+backward time of every attention variant on this machine (not a test).

    python -m harness.bench.attention                 # variants × T = 512, 2048, 8192, both masks
    python -m harness.bench.attention --toeplitz      # kernelized with vs without a relative bias, T = 2048
    python -m harness.bench.attention --memory        # peak RSS per variant at T = 8192 (one process each)

B = 1, H = 4, D = 32 (the default model: d_model 128 / 4 heads), float32; median of ``--repeats``
after one warm-up. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

import torch

from attention.base import AttentionContext
from attention.linear import Linear
from attention.local import Local
from attention.performer import Performer
from attention.softmax import Softmax
from harness.bench.measure import time_call
from harness.markdown import table as markdown
from positional.base import RelativeBias, Shape

B, H, D = 1, 4, 32
VARIANTS = {
    "softmax (sdpa)": lambda s: Softmax(s),
    "softmax (math)": lambda s: Softmax(s, backend="math"),
    "local (w=32)": lambda s: Local(s, window=32),
    "local (w=256)": lambda s: Local(s, window=256),
    "linear": lambda s: Linear(s),
    "performer (M=110)": lambda s: Performer(s),
}


def _time_fwd_bwd(name: str, T: int, causal: bool, relative: bool = False, repeats: int = 3) -> float:
    torch.manual_seed(0)
    variant = VARIANTS[name](Shape(H * D, H, 1, max(T, 256), causal))
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    table = torch.randn(H, 2 * T - 1, requires_grad=True) if relative else None

    def step():
        ctx = AttentionContext(causal=causal, bias=None if table is None else RelativeBias(table, T, T))
        variant(q, k, v, ctx).sum().backward()

    times = [time_call(step, "cpu") for _ in range(repeats + 1)]
    return statistics.median(times[1:] or times)  # the first call warms up


def table(rows: list[tuple[str, dict]], columns: list[str]) -> str:
    return "\n".join(  # "—" where a variant has no cell
        markdown(["variant", *columns], [[name, *(cells.get(c, "—") for c in columns)] for name, cells in rows])
    )


def _main_times(args) -> None:
    lengths = [512, 2048, 8192]
    rows = []
    for name in VARIANTS:
        cells = {
            f"T={T}{' causal' if causal else ''}": f"{_time_fwd_bwd(name, T, causal, repeats=args.repeats):.3f}"
            for T in lengths
            if name != "softmax (math)" or T <= 2048  # math at 8192: a dense (4, 8192, 8192) logit tensor, GBs
            for causal in (False, True)
        }
        rows.append((name, cells))
        print(f"  done {name}", file=sys.stderr)
    print(table(rows, [f"T={T}{' causal' if c else ''}" for T in lengths for c in (False, True)]))


def _main_toeplitz(args) -> None:
    T = 2048
    rows = [
        (
            name,
            {
                f"{way}{' causal' if causal else ''}": f"{_time_fwd_bwd(name, T, causal, relative, args.repeats):.3f}"
                for causal in (False, True)
                for way, relative in (("plain", False), ("+relative bias (FFT)", True))
            },
        )
        for name in ("linear", "performer (M=110)")
    ]
    print(f"T={T}, seconds (fwd+bwd)")
    print(table(rows, ["plain", "+relative bias (FFT)", "plain causal", "+relative bias (FFT) causal"]))


def _main_memory(args) -> None:
    T = 8192
    rows = [
        (
            name,
            {
                f"{'causal' if causal else 'bidir'}{' +rel' if relative else ''}": (
                    f"{_peak_mib(name, T, causal, relative):.0f}"
                )
                for causal in (False, True)
                for relative in ((False, True) if name in ("linear", "performer (M=110)") else (False,))
            },
        )
        for name in VARIANTS
        if name != "softmax (math)"
    ]
    print(f"T={T}, peak RSS above the idle process, MiB")
    print(table(rows, ["bidir", "causal", "bidir +rel", "causal +rel"]))


def _peak_mib(name: str, T: int, causal: bool, relative: bool) -> float:
    """The peak RSS of one variant's forward+backward above the idle process, MiB, in a fresh process (``--one``)."""
    cmd = [
        sys.executable,
        "-m",
        "harness.bench.attention",
        "--one",
        json.dumps([name, T, causal, relative]),
        "--threads",
        str(torch.get_num_threads()),
    ]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def _main_one(spec: str) -> None:
    name, T, causal, relative = json.loads(spec)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _time_fwd_bwd(name, T, causal, relative, repeats=0)
    print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024))


def main(argv: list[str] | None = None) -> int:
    from harness.errors import ConfigError, OneLineParser, said_refusal
    from harness.ranges import PositiveInt, at_most
    from harness.record.preflight import number

    parser = OneLineParser(prog="python -m harness.bench.attention", description=__doc__.splitlines()[0])
    parser.add_argument("--toeplitz", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--repeats", type=number(at_most(PositiveInt, 1000), int), default=3)
    parser.add_argument(
        "--threads",
        type=number(at_most(PositiveInt, os.cpu_count() or 1), int),
        default=None,
        help="torch's intra-op threads, at most this machine's cores",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    try:
        args = parser.parse_args(argv)
    except ConfigError as e:
        return said_refusal(e)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}", file=sys.stderr
    )
    if args.one:
        _main_one(args.one)
    elif args.toeplitz:
        _main_toeplitz(args)
    elif args.memory:
        _main_memory(args)
    else:
        _main_times(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
