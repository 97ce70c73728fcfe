"""A user's own class that raises (``pos._target_=theirs.Class``): the error names their class and shows their frames
only, not the 60-70 lines of Hydra, Lightning and posbench around them; an error raised inside posbench or a
library keeps its whole traceback."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests import inprocess
from tests.helpers import HANG

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


def run(home, monkeypatch, *args: str) -> dict:
    """run.py in this interpreter with the user's package importable from ``home``, fresh (each test has its own)."""
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.delitem(sys.modules, "theirs", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    argv = [*args, f"hydra.run.dir={home}/run"]
    return inprocess.run("run", argv, str(home), {"MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}, HANG)


@pytest.mark.parametrize(
    "target, where", [("theirs.BadInit", "theirs.BadInit.check"), ("theirs.BadForward", "theirs.BadForward.embed")]
)
def test_a_users_class_that_raises_is_named_with_its_own_frames_only(home, monkeypatch, target, where):
    done = run(home, monkeypatch, f"pos._target_={target}", "model.n_layers=1", "trainer.max_steps=2")
    assert done["code"] == 1, done["stderr"][-2000:]
    error = done["stderr"][done["stderr"].index("error: ") :]
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
