"""What one step costs: time, memory, FLOPs, and the matmul peak MFU is measured against.

Device-agnostic: on CPU wall time (perf_counter) and the peak bytes of tensors the step allocates
(torch.profiler's allocation events: independent of the allocator's caching and of RSS drift); on CUDA,
CUDA events and torch.cuda.max_memory_allocated. The ``cuda`` argument of the device functions is the
torch.cuda module, injectable so the CUDA branches are tested on a machine without one.

Notation: B batch, T length, V vocabulary.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils import flop_counter as fc

Step = Callable[[], object]  # what a call returns is not read


def time_call(fn: Step, device: str, cuda=torch.cuda) -> float:
    """Seconds one call of ``fn`` takes on ``device``: CUDA events around it on cuda (no host stalls
    inside the step), wall time on CPU."""
    if device == "cuda":
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_allocated_bytes(fn: Step, device: str, cuda=torch.cuda) -> float:
    """Peak bytes of tensors alive during one call of ``fn`` above those alive before it: max allocated
    after a reset on CUDA; on CPU the profiler records every allocation (+bytes) and free (−bytes) with its
    time, and their running sum is the bytes of live tensors allocated since the start, its maximum the peak."""
    if device == "cuda":
        cuda.synchronize()
        cuda.reset_peak_memory_stats()
        base = cuda.memory_allocated()
        fn()
        cuda.synchronize()
        return float(cuda.max_memory_allocated() - base)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    return float(max([0, *itertools.accumulate(e.nbytes() for e in sorted(events, key=lambda e: e.start_ns()))]))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def trim(device: str = "cpu") -> None:
    """Collect garbage and hand freed pages back (glibc; on ``cuda`` also the CUDA cache, and the peak count
    restarts), so the next cell starts from a clean slate."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class PeakRss:
    """Samples RSS in a thread (torch ops release the GIL) and keeps the peak: a secondary, allocator-
    dependent view of memory (reported as ``rss_delta_mb``; targets use ``peak_allocated_bytes``)."""

    def __enter__(self):
        trim()
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


class Peak(NamedTuple):
    flops: float  # FLOP/s
    n: int  # the matrix size that reached it


def matmul_peak_flops(device: str = "cpu", sizes: tuple[int, ...] = (2048, 4096), seconds: float = 1.5) -> Peak:
    """Best FLOP/s of square n×n @ n×n matmuls (fp32 on CPU, bf16 on GPU), timed here and now.

    Several sizes, best of all: a peak that a training step's own GEMMs beat would flatter MFU."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    best = Peak(0.0, sizes[0])
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up: first call allocates and picks a kernel
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            flops = 2 * n**3 / time_call(partial(torch.matmul, a, b), device)
            if flops > best.flops:
                best = Peak(flops, n)
    return best


def _register_cpu_sdpa_flops() -> None:
    """torch's FlopCounterMode knows the CUDA SDPA kernels but not the CPU flash kernel that
    F.scaled_dot_product_attention dispatches to here; without this, attention counts 0 FLOPs."""
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd in fc.flop_registry:
        return
    # the CUDA kernels' formulas: the CPU ops take (grad_out,) query, key, value first too
    fc.register_flop_formula(fwd, get_raw=True)(fc.sdpa_flop)
    fc.register_flop_formula(bwd, get_raw=True)(fc.sdpa_backward_flop)


def count_flops(step: Step) -> float:
    """FLOPs of one call, from the shapes of its matmul/bmm/SDPA ops (torch.utils.flop_counter)."""
    _register_cpu_sdpa_flops()
    with fc.FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def timed_steps(step: Step, device: str, warmup: int, repeats: int, cell_s: float = float("inf")) -> list[float]:
    """The seconds of up to ``repeats`` timed calls after ``warmup`` untimed ones; fewer once the timed calls
    add up to ``cell_s`` seconds (at least one), so long cells fit the run's time budget."""
    for _ in range(warmup):
        step()
    times: list[float] = []
    for _ in range(repeats):
        times.append(time_call(step, device))
        if sum(times) >= cell_s:
            break
    return times


def make_step(
    forward: Callable[[torch.Tensor], torch.Tensor], module: torch.nn.Module, ids: torch.Tensor, autocast: bool
) -> Step:
    """One forward+backward with a cross-entropy loss (next token); grads are dropped afterwards."""
    labels = ids.roll(-1, dims=1)

    def step():
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = forward(ids)  # (B, T, V)
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
        module.zero_grad(set_to_none=True)

    return step
