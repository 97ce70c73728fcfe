"""Bring your own scheme: one file and one YAML, inside the repo or in the user's own package.

A throwaway scheme — a learned linear distance penalty, b_ij = −softplus(w_h)·|i − j| — is written
  - outside the repo, as a package on PYTHONPATH, named either by a YAML in the user's config directory
    (``--config-dir``) or directly by ``pos._target_=``: it goes through ``--check``, ``--matrix``,
    ``--list`` and a 2-cell sweep whose report names it, as a built-in would;
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

from tests.helpers import ROOT, TINY
from tests.user_package import SCHEME, write_user_package, yaml_for

pytestmark = pytest.mark.slow

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


def run(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None, timeout: int = 300):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A user's own package (mypkg/decay.py) and config directory (myconf/pos/decay.yaml), outside the repo."""
    home = write_user_package(tmp_path_factory.mktemp("user"))
    env = {"PYTHONPATH": os.pathsep.join([str(home), os.environ.get("PYTHONPATH", "")]),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}
    return home, env


def test_a_scheme_in_the_users_config_dir_is_checked_listed_and_paired(user):
    home, env = user
    cd = ["--config-dir", str(home / "myconf")]
    done = run(["--check", *cd, "pos=decay", "attn=performer", *TINY], home, env)
    assert done.returncode == 0 and "ok: pos=decay attn=performer" in done.stdout, done.stderr
    done = run(["--matrix", *cd], home, env)
    row = next(line for line in done.stdout.splitlines() if line.startswith("decay "))
    assert done.returncode == 0 and row.split()[1:] == ["ok"] * 4  # a relative bias: every variant takes it
    done = run(["--list", *cd], home, env)
    assert "decay" in done.stdout and "Learned linear decay" in done.stdout and "bias: relative" in done.stdout
    done = run(["--check", *cd, "pos=decay", "pos.init=-1", *TINY], home, env)  # its own error, as a config key
    assert done.returncode == 2 and done.stderr.strip() == "error: pos.init=-1 must be positive", done.stderr


def test_a_class_named_by_target_is_named_after_its_module_and_refuses_bad_keys(user):
    home, env = user
    done = run(["--check", "pos._target_=mypkg.decay.Decay", *TINY], home, env)  # from the default pos=rope
    assert done.returncode == 0 and "ok: pos=decay attn=softmax" in done.stdout, done.stderr
    done = run(["--matrix", "pos._target_=mypkg.decay.Decay"], home, env)
    assert any(line.startswith("decay ") for line in done.stdout.splitlines())
    done = run(["--check", "pos._target_=mypkg.decay.Decay", "+pos.nope=1", *TINY], home, env)
    assert done.returncode == 2 and "pos.nope is not a setting of pos=decay" in done.stderr, done.stderr
    done = run(["--check", "pos._target_=mypkg.nothere.Decay", *TINY], home, env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "cannot be imported" in done.stderr


def test_a_two_cell_sweep_reports_the_users_scheme_beside_a_built_in(user):
    from mlflow.tracking import MlflowClient

    home, env = user
    done = run(["-m", "--config-dir", str(home / "myconf"), "pos=none,decay", *TINY], home, env)
    assert done.returncode == 0, done.stderr[-2000:]
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("sweep_role") == "parent")
    children = {r.data.tags["pos"]: r for r in runs if r is not parent}
    assert set(children) == {"none", "decay"} and all(r.info.status == "FINISHED" for r in children.values())
    assert children["decay"].data.params["pos._target_"] == "mypkg.decay.Decay"
    report = Path(client.download_artifacts(parent.info.run_id, "report.md", str(home))).read_text()
    assert "decay" in report and "none" in report


def repo_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked-not-ignored), nothing generated."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
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
    (repo / "tests" / f"test_pos_{NAME}.py").write_text(OWN_TEST)
    env = {**os.environ, "PYTHONPATH": str(repo), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    # every test whose cells or rows come from conf/ (its name carries the scheme's), and the matrix's; the
    # bad-input table (whose option lists are derived too) and the install test run in the suite itself
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k",
                           f"({NAME} or matrix) and not install", "tests"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    counts = done.stdout.strip().splitlines()[-1]
    passed = int(counts.split(" passed")[0].split()[-1])
    assert passed >= 10, counts  # composition, training, the grid's cells, implied weights, its own test, …
