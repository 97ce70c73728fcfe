"""A user's own class that raises (``pos._target_=theirs.Class``): the error names their class and shows their frames
only, not the 60-70 lines of Hydra, Lightning and posbench around them; an error raised inside posbench or a
library keeps its whole traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import HANG, ROOT

THEIRS = textwrap.dedent("""\
    from positional.base import PositionalScheme


    class BadInit(PositionalScheme):
        def __init__(self, shape, scale: float = 1.0):
            super().__init__(shape)
            self.check(scale)

        def check(self, scale):
            raise ValueError(f"scale={scale} is not what I expected")


    class BadForward(PositionalScheme):
        def embed(self, x, positions):
            raise RuntimeError("forward broke")

        def hooks(self):
            return frozenset({"embed"})
    """)


@pytest.fixture
def home(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "__init__.py").write_text(THEIRS)
    return tmp_path


def run(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args, f"hydra.run.dir={home}/run"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG,
    )


@pytest.mark.parametrize(
    "target, where", [("theirs.BadInit", "theirs.BadInit.check"), ("theirs.BadForward", "theirs.BadForward.embed")]
)
def test_a_users_class_that_raises_is_named_with_its_own_frames_only(home, target, where):
    done = run(home, f"pos._target_={target}", "model.n_layers=1", "trainer.max_steps=2")
    assert done.returncode == 1, done.stderr[-2000:]
    error = done.stderr[done.stderr.index("error: ") :]
    assert error.startswith("error: your code raised ") and f"({where}, {home / 'theirs' / '__init__.py'}" in error
    frames = [line for line in error.splitlines() if line.strip().startswith("File ")]
    assert frames and all(str(home) in f for f in frames)  # no frame of posbench, Hydra or Lightning
    assert len(error.splitlines()) <= 8


def test_an_error_raised_inside_posbench_or_a_library_is_not_blamed_on_the_user():
    import json

    from harness.errors import ConfigError, users_code_failed
    from harness.model.layers import layer_names

    with pytest.raises(ConfigError) as ours:
        layer_names((), 4)  # raises in harness/model/layers.py
    with pytest.raises(ValueError) as library:
        json.loads("{")  # raises in the standard library
    assert users_code_failed(ours.value) is None and users_code_failed(library.value) is None
