"""A full disk as a real command meets it: a file-size limit (``ulimit -f``, set in the child before it starts) hit
mid-write is one line, exit 1, and nothing half-written: ``posbench prepare``'s shards and ``python -m results
report``'s folder."""

import resource
import subprocess
import sys

import pytest

from tests.helpers import HANG, ROOT


def limited(argv: list[str], size: int) -> subprocess.CompletedProcess:
    """``argv`` run from the checkout, each file it writes limited to ``size`` bytes (set in the child)."""
    return subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY)),
    )


@pytest.mark.parametrize("made", [False, True])
def test_prepare_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, made):
    """A file-size limit (as a full disk) mid-shard: one line, exit 1, and no half-written folder (no
    shard without its manifest); a folder that was there before stays, emptied of
    what prepare wrote."""
    out = tmp_path / "out"
    if made:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    done = limited([sys.executable, "run.py", "prepare", str(out), "data=embedded"], 200_000)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: writing failed: a file-size limit (ulimit -f) was hit; nothing was left in {out}: free space (or "
        "raise the limit) and run prepare again"
    ]
    assert (sorted(p.name for p in out.iterdir()) == ["notes.txt"]) if made else not out.exists()


def test_a_report_command_on_a_full_disk_is_one_line(tmp_path, tiny_sweep):
    """python -m results report under a file-size limit: exit 1, one line, the folder as it was (none here)."""
    out = tmp_path / "out"
    done = limited(
        [sys.executable, "-m", "results", "report", "--tracking-uri", tiny_sweep.uri, "--out", str(out)], 20_000
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert (
        line.startswith("error: writing failed: a file-size limit (ulimit -f) was hit")
        and "put back as they were" in line
    )
    assert not out.exists() or not any(out.iterdir())
