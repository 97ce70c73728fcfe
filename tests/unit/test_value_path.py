"""tools/value_path.py as a test: a value typed on the command line (``pos.base``) reaches RoPE's constructor through
at most 10 project files, the scheme's own included (11 at fac11e2, when issue 42 was filed; 13 before the config
helpers took only what they read). A new hop on the config path is a choice to make in docs/architecture.md, not an
accident; the tool prints the path (``python tools/value_path.py``)."""

from __future__ import annotations

import importlib.util
import sys

from tests import inprocess
from tests.helpers import ROOT

MOST_FILES = 10


def _tool(monkeypatch):
    spec = importlib.util.spec_from_file_location("value_path", ROOT / "tools" / "value_path.py")
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "value_path", tool)
    spec.loader.exec_module(tool)
    return tool


def test_a_command_line_value_reaches_the_scheme_through_few_files(store, tmp_path, monkeypatch):
    tool = _tool(monkeypatch)
    argv = ["pos.base=31337", f"logger.tracking_uri={store}", f"hydra.run.dir={tmp_path / 'out'}"]
    reply = inprocess.run(tool.main, argv, str(tmp_path), {}, timeout=120)
    assert reply["code"] == 0, reply["stdout"] + reply["stderr"][-2000:]
    head, *files = reply["stdout"].strip().splitlines()
    names = [line.strip().partition(":")[0] for line in files]
    assert names[-1] == "positional/rope.py" and names[0] == "harness/cli.py", reply["stdout"]
    assert "harness/config/validate.py" in names  # the one validation pass, on the way
    assert len(names) <= MOST_FILES, reply["stdout"]
    assert head.startswith(f"{len(names)} files, ")


def test_the_tool_sees_a_value_however_it_is_held(monkeypatch):
    from omegaconf import OmegaConf

    tool = _tool(monkeypatch)
    node = OmegaConf.create({"pos": {"base": 31337}, "other": "${pos.base}"})
    assert tool.holds(node, 31337) and tool.holds(["x", ("pos.base=31337",)], 31337)
    assert tool.holds({"a": {"b": {"c": 31337.0}}}, 31337)
    assert not tool.holds(OmegaConf.create({"pos": {"base": 10000}}), 31337)
    assert not tool.holds(True, 1) and not tool.holds([[[[[[[31337]]]]]]], 31337)  # a bool is no number; 5 deep
