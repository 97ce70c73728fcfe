"""The scale=paper presets (conf/experiment/*/scale/paper.yaml) and their sweep cells, loaded as a user's command
would: a plain module for tests/unit/test_paper_scale.py and tests/process/test_paper_scale_e2e.py."""

from __future__ import annotations

import itertools

from harness.config.check import check
from harness.config.estimates import NamedGpu
from harness.config.load import compose, load
from harness.errors import IncompatiblePairing
from tests.helpers import ROOT

PAPER = sorted(p.parent.parent.name for p in (ROOT / "conf" / "experiment").glob("*/scale/paper.yaml"))
GPU = NamedGpu.parse("80GB")


def _cells(preset: str):
    """The preset's sweep cells at seed 0, in order (a glob axis: every option of its group; a searched axis,
    tune_lr's learning rate: left at the config's value)."""
    params = compose([f"experiment={preset}", "scale=paper"], hydra=True).hydra.sweeper.params
    axes = []
    for key, values in params.items():
        values = str(values)
        if key == "seed":
            axes.append([f"{key}=0"])
        elif values.startswith("glob("):
            axes.append([f"{key}={p.stem}" for p in sorted((ROOT / "conf" / key).glob("*.yaml"))])
        elif "(" not in values:
            axes.append([f"{key}={v}" for v in values.split(",")])
    return [list(c) for c in itertools.product(*axes)]


def _composed(overrides: list[str], stand_in: bool = True):
    """The RunSpec of ``overrides``, loaded as one cell of a sweep (``-m``); ``stand_in``: the embedded corpus and
    the byte vocabulary standing in for the paper's on purpose (``~paper budget.max_epochs=null``, as a user would
    write them)."""
    if stand_in:
        on_purpose = ["budget.max_epochs=null", *(["~paper"] if "paper" in compose(overrides) else [])]
        overrides = [*overrides, *on_purpose]
    return load(overrides, multirun=True)


def _first_cell(preset: str) -> tuple[list[str], object]:
    """The first cell the checks let train (a grid's refused pairings are recorded, not trained)."""
    for cell in _cells(preset):
        try:
            return cell, check(_composed([f"experiment={preset}", "scale=paper", *cell]), GPU)
        except IncompatiblePairing:
            continue
    raise AssertionError(f"no cell of {preset} passes")
