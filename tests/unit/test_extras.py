"""Options that need an optional package: each class declares it (``requires``), the package is in the extra the
fix names, and a run or ``--check`` without it is refused in one line before anything is built or read.

A package is made missing the way Python itself blocks one: ``sys.modules[name] = None`` (``import name`` then
raises ImportError), for one test.
"""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from harness.config.load import load
from harness.errors import ConfigError
from harness.extras import extra_for, require
from harness.paths import CONF
from positional.base import PositionalScheme, Shape
from tests.helpers import ROOT, validated


def declared_targets() -> dict[str, str]:
    """conf/…/<option>.yaml → every ``_target_`` it names, nested nodes included (data=hf's ``source``)."""
    found = {}

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("_target_"), str):
                found[where] = node["_target_"]
            for key, value in node.items():
                walk(value, f"{where}.{key}")

    for path in sorted(CONF.rglob("*.yaml")):
        walk(yaml.safe_load(path.read_text()) or {}, str(path.relative_to(CONF)))
    return found


def pyproject_extras() -> dict[str, set[str]]:
    from setuptools.config.pyprojecttoml import read_configuration

    extras = read_configuration(ROOT / "pyproject.toml", expand=False)["project"]["optional-dependencies"]
    names = {
        extra: {re.sub(r"[-_.]+", "_", re.match(r"[A-Za-z0-9._-]+", r)[0]).lower() for r in reqs}
        for extra, reqs in extras.items()
    }
    for extra, reqs in extras.items():  # posbench[hf,tune]: those extras' packages too
        for own in (m[1] for r in reqs if (m := re.match(r"posbench\[([^]]+)\]", r))):
            names[extra] |= set().union(*(names[e.strip()] for e in own.split(",")))
    return names


def test_every_declared_package_is_in_a_user_extra_and_the_hf_options_declare_theirs():
    from hydra.utils import get_object

    declared = {
        where: tuple(getattr(get_object(t), "requires", ()))
        for where, t in declared_targets().items()
        if not t.startswith(("hydra", "lightning"))
    }
    extras = pyproject_extras()
    for where, modules in declared.items():
        for module in modules:
            holders = [e for e, names in extras.items() if module in names and e != "test"]
            assert holders, f"{where} requires {module}, which no extra but test installs"
            assert module in extras["test"], f"{module}: the suite tests {where}, so the test extra brings it too"
    assert declared["tokenizer/bpe.yaml"] == declared["tokenizer/wordpiece.yaml"] == ("tokenizers",)
    assert set(declared["tokenizer/hf.yaml"]) == {"transformers", "tokenizers"}
    assert declared["data/hf.yaml.source"] == ("datasets",)
    assert {"datasets", "tokenizers", "transformers"} <= extras["hf"]


@pytest.mark.parametrize(
    "overrides, module, owner",
    [
        (["tokenizer=bpe", "task=clm"], "tokenizers", "tokenizer=bpe"),
        (["tokenizer=wordpiece"], "tokenizers", "tokenizer=wordpiece"),
        (["tokenizer=hf", "tokenizer.name=gpt2", "task=clm"], "transformers", "tokenizer=hf"),
        (["data=hf", "data.path=/nonexistent/corpus"], "datasets", "data=hf"),
    ],
)
def test_a_missing_package_is_refused_in_one_line_naming_the_extra(store, monkeypatch, overrides, module, owner):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError) as e:
        validated(*overrides)
    fix = f"pip install 'posbench[{extra_for(module)}]'" if extra_for(module) else f"pip install {module}"
    assert str(e.value).startswith(f"{owner} needs {module}, which is not installed here; {fix}"), e.value
    assert "\n" not in str(e.value)


class Needy(PositionalScheme):
    """A user's scheme that declares a package nobody has."""

    requires = ("posbench_no_such_package",)


def test_a_users_class_names_its_own_package():
    refusal = "^pos=test_extras needs posbench_no_such_package, which is not installed here; pip install posbench_no"
    with pytest.raises(ConfigError, match=refusal):
        load([f"pos._target_={Needy.__module__}.Needy"]).pos.factory()(Shape(32, 2, 2, 64, False))
    with pytest.raises(ConfigError, match="needs a and b, which are not installed"):
        require("x", ("a", "b"))
    require("x", ("sys", "json"))  # present: nothing to say
