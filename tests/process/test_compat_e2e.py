"""compat: the tests that start real processes (the rest: tests/unit/test_compat.py).

The compatibility matrix: from declarations, consistent with check_pairing, rendered for humans.
"""

import subprocess
import sys

from tests.helpers import ROOT


def test_run_py_matrix_flag_bypasses_hydra():
    done = subprocess.run([sys.executable, "run.py", "--matrix"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pos \\ attn")
