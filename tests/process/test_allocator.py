"""harness/allocator.py: with glibc's mmap off, a freed large tensor's memory is reused by the next one
instead of being page-faulted in again; POSBENCH_MALLOC=system and other C libraries leave malloc alone.

The fault counts run in child processes: mallopt would change this test process for every later test.
"""

import os
import platform
import subprocess
import sys

import pytest

from harness import allocator
from tests.helpers import ROOT

PAGES = 64 * 2**20 // 4096  # a 64 MiB tensor's 4 KiB pages

CHILD = """
import resource, torch
from harness.allocator import keep_freed_memory, setting
keep_freed_memory()
def cycle():
    x = torch.ones(16 * 2**20)  # 64 MiB, touched
    del x
for _ in range(10):  # malloc's heap settles on its size
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(setting(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5, sep="|")
"""


def child_faults(env: dict[str, str]) -> tuple[str, float]:
    out = (
        subprocess.run(
            [sys.executable, "-c", CHILD],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    setting, faults = out.split("|")
    return setting, float(faults)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_tensor_memory_is_reused_not_faulted_in_again():
    setting, faults = child_faults({allocator.ENV: ""})
    assert setting == "glibc malloc, mmap off (freed memory reused)"
    assert faults < 0.05 * PAGES  # the 64 MiB came back from malloc's heap
    setting, faults = child_faults({allocator.ENV: "system"})
    assert setting == f"system malloc ({allocator.ENV}=system)"
    assert faults > 0.9 * PAGES  # mmap'd afresh and munmap'd on free: every page faulted in each time


def test_setting_says_why_malloc_was_left_alone(monkeypatch):
    monkeypatch.setattr(allocator, "_setting", allocator.setting())  # restored after the test
    monkeypatch.setenv(allocator.ENV, "System")
    assert allocator.keep_freed_memory() == allocator.setting() == "system malloc (POSBENCH_MALLOC=system)"
    monkeypatch.delenv(allocator.ENV)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert allocator.keep_freed_memory() == "system malloc (not glibc)"
