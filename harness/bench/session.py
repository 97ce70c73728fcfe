"""One benchmark run: measures cells once each (a cell shared by the grid, a peer and a target is
measured once) and keeps a cell's warm step alive while a target or a peer comparison times it again.

Per cell: the FLOP-counting step runs first (it warms every kernel and buffer up) and also gives the
peak allocated memory; then up to ``repeats`` timed steps (fewer past ``cell_s`` seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.bench.cells import Built, Spec, build_posbench
from harness.bench.measure import PeakRss, Step, count_flops, measure, peak_allocated_bytes, trim
from harness.bench.pairing import Live, prepare
from harness.errors import ConfigError


@dataclass
class Result:
    """One measured cell: a row of bench.csv and one MLflow run."""

    name: str  # "posbench" or the peer's name
    pos: str
    attn: str
    seq_len: int
    batch: int
    step_s: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_mem_mb: float = float("nan")  # peak bytes of tensors allocated by one step (see measure.py)
    rss_delta_mb: float = float("nan")  # peak RSS increase during the timed steps (CPU; allocator-dependent)
    flops: float = float("nan")
    mfu: float = float("nan")
    repeats: int = 0  # timed steps behind step_s
    status: str = "ok"  # ok | refused | error | skipped
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Options:
    device: str
    peak_flops: float  # the run's matmul peak (FLOP/s), for each cell's MFU column
    peak_n: int = 2048  # the matrix size that reached it
    warmup: int = 0
    repeats: int = 3
    cell_s: float = 5.0


@dataclass
class Session:
    options: Options
    measured: dict[tuple[str, Spec], Result] = field(default_factory=dict)
    _live: dict[tuple[str, Spec], Live] = field(default_factory=dict)
    log: Callable[[str], None] = print

    def cell(
        self, spec: Spec, name: str = "posbench", build: Callable[[Spec], Built] = build_posbench, keep: bool = False
    ) -> Result:
        """The cell's result, measuring it the first time; ``keep``: hold its warm step for ``step``."""
        key = (name, spec)
        if key not in self.measured:
            self.measured[key], live = self._measure(name, spec, build)
            self.log(_line(self.measured[key]))
            if keep and live is not None:
                self._live[key] = live
        elif keep and key not in self._live and self.measured[key].ok:  # measured earlier, released since
            self._live[key] = prepare(spec, build, self.options.device)
            self._live[key].step()  # warm
        return self.measured[key]

    def step(self, spec: Spec, name: str = "posbench") -> Step:
        return self._live[(name, spec)].step

    def model(self, spec: Spec, name: str = "posbench"):
        return self._live[(name, spec)].module

    def release(self) -> None:
        """Drop every kept step (and its model), so the next cell's memory starts clean."""
        self._live.clear()
        trim()

    def _measure(self, name: str, spec: Spec, build: Callable[[Spec], Built]) -> tuple[Result, Live | None]:
        r, o = Result(name, spec.pos, spec.attn, spec.seq_len, spec.batch), self.options
        live = None
        try:
            live = prepare(spec, build, o.device)
            step = live.step
            peak_bytes = peak_allocated_bytes(lambda: setattr(r, "flops", count_flops(step)), o.device)
            with PeakRss() as rss:
                timing = measure(step, spec.tokens, o.device, o.warmup, o.repeats, o.cell_s)
            r.peak_mem_mb, r.rss_delta_mb = peak_bytes / 2**20, rss.delta_mb
            r.step_s, r.tokens_per_s, r.repeats = timing["step_s"], timing["tokens_per_s"], timing["repeats"]
            r.mfu = r.flops / r.step_s / o.peak_flops
        except ConfigError as e:
            r.status, r.reason, live = "refused", str(e), None
        except Exception as e:  # a broken cell is recorded, the run goes on (and exits non-zero)
            r.status, r.reason, live = "error", " ".join(f"{type(e).__name__}: {e}".split())[:300], None
        trim()
        return r, live


def _line(r: Result) -> str:
    shown = (
        (f"{r.step_s * 1e3:9.1f} ms {r.tokens_per_s:10,.0f} tok/s {r.peak_mem_mb:8.1f} MB MFU {r.mfu:6.1%}")
        if r.ok
        else f"{r.status}: {r.reason[:90]}"
    )
    return f"  {r.name:30s} {r.pos:>14s} {r.attn:>9s} T={r.seq_len:<6d} B={r.batch:<3d} {shown}"
