"""CPU memory: keep freed memory in the process for the next step instead of handing it back to the OS.

glibc's malloc serves a request above its mmap threshold (at most 32 MiB on 64-bit Linux) with a fresh
``mmap`` and gives it back with ``munmap`` when it is freed. A training step whose tensors exceed that
(a long sequence's activations, local attention's (B, H, N, C, K) band) then page-faults all of them in
again on every step, the kernel zeroing each 4 KiB page: a step's time then grows faster than its work
with the sequence length (in the profile of a long local-attention step, every op was slowed alike).

``keep_freed_memory`` turns glibc's mmap off for this process (``mallopt(M_MMAP_MAX, 0)``) and raises its
trim threshold, so freed tensors stay on malloc's heap and the next step reuses them (what jemalloc or
tcmalloc, which PyTorch's CPU tuning guide recommends preloading, do by default). The cost: the process's
resident memory stays near its peak instead of shrinking between steps. ``run.py`` and
``python -m harness.bench`` call it at start; ``POSBENCH_MALLOC=system`` leaves malloc as it is. Elsewhere
than glibc (macOS, musl) it does nothing. ``setting()`` says what holds, for the run's tags and the
benchmark report.

Ground: imports nothing from the project.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

ENV = "POSBENCH_MALLOC"  # "system": leave malloc as it is
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
TRIM_THRESHOLD = 1 << 30  # bytes free at the top of the heap before malloc gives any back

_setting = "system malloc"


def keep_freed_memory() -> str:
    """Turn off glibc malloc's mmap for large blocks in this process (once is enough; calling again is
    harmless). Returns ``setting()``."""
    global _setting
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen not in ("", "system"):
        from harness.errors import ConfigError

        raise ConfigError(f"{ENV}={os.environ[ENV]!r}: use {ENV}=system (leave malloc as it is), or unset it")
    if chosen == "system":
        _setting = f"system malloc ({ENV}=system)"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _setting = "system malloc (not glibc)"
    else:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        if libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
            _setting = "glibc malloc, mmap off (freed memory reused)"
        else:
            _setting = "system malloc (mallopt refused)"
    return _setting


def setting() -> str:
    """What holds in this process: glibc with mmap off, or the system's malloc and why."""
    return _setting


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping); None if unknown."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    return None
