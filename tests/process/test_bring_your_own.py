"""Bring your own scheme: one file and one YAML inside the repo.

A throwaway scheme — a learned linear distance penalty, b_ij = −softplus(w_h)·|i − j| (tests/user_package.py) — is
written
  - outside the repo, as the user's own package: tests/process/test_install.py runs it through an installed copy's
    ``--check``, ``--matrix``, ``--list`` and a sweep, named by ``--config-dir`` or by ``pos._target_=``;
  - inside a copy of the repo as ``positional/<name>.py`` + ``conf/pos/<name>.yaml`` + its own test, and
    every test that enumerates the schemes (composition, training, the grid, implied weights, the matrix,
    full-graph compilation, the bad-input table) runs it and passes with no other file touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HANG, ROOT
from tests.user_package import SCHEME, yaml_for

NAME = "byodecay"  # a name no other test id contains, so -k selects exactly the tests it joins

OWN_TEST = f'''
"""The throwaway scheme's own test: its bias against the explicit O(T²) form, in float64."""

import torch
import torch.nn.functional as F

from positional.base import Shape
from positional.{NAME} import Decay


def test_bias_is_minus_softplus_w_times_distance():
    scheme = Decay(Shape(8, 2, 1, 6, causal=False), init=0.3).double()
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = -F.softplus(scheme.w)[:, None, None] * (i - j).abs()
    torch.testing.assert_close(scheme.logit_bias(torch.arange(6), 0).dense()[0], want, rtol=0, atol=1e-12)
'''


def repo_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked-not-ignored), nothing generated."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout to copy")
def test_one_file_and_one_yaml_join_every_test_that_enumerates_schemes(tmp_path):
    repo = repo_copy(tmp_path / "repo")
    (repo / "positional" / f"{NAME}.py").write_text(SCHEME)
    (repo / "conf" / "pos" / f"{NAME}.yaml").write_text(yaml_for(f"positional.{NAME}.Decay"))
    (repo / "tests" / "unit" / f"test_pos_{NAME}.py").write_text(OWN_TEST)
    env = {**os.environ, "PYTHONPATH": str(repo), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    # every test whose cells or rows come from conf/ (its name carries the scheme's), and the matrix's; the
    # bad-input table (whose option lists are derived too; its matrix-* rows, in-process and as real commands,
    # too) and the install test run in the suite itself
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            "-k",
            f"({NAME} or matrix) and not install and not bad_input",
            "tests",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    counts = done.stdout.strip().splitlines()[-1]
    passed = int(counts.split(" passed")[0].split()[-1])
    assert passed >= 10, counts  # composition, training, the grid's cells, implied weights, its own test, …
