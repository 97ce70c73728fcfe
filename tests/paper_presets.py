"""The scale=paper presets (conf/experiment/*/scale/paper.yaml) and their sweep cells, composed as a user's command
would: a plain module for tests/unit/test_paper_scale.py and tests/process/test_paper_scale_e2e.py."""

from __future__ import annotations

import itertools

from omegaconf import open_dict

from harness.config.compose import compose
from harness.config.resources import NamedGpu
from harness.config.validate import validate
from harness.errors import IncompatiblePairing
from tests.helpers import ROOT

PAPER = sorted(p.parent.parent.name for p in (ROOT / "conf" / "experiment").glob("*/scale/paper.yaml"))
GPU = NamedGpu.parse("80GB")
GROUPS = ("pos", "attn", "task", "data", "experiment", "scale")


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
    """The config of ``overrides``; ``stand_in``: the embedded corpus and the byte vocabulary standing in for the
    paper's on purpose (``~paper budget.max_epochs=null``, as a user would write them)."""
    cfg = compose(overrides, hydra=True)
    if stand_in:
        on_purpose = ["budget.max_epochs=null", *(["~paper"] if "paper" in cfg else [])]
        cfg = compose([*overrides, *on_purpose], hydra=True)
    choices = {g: cfg.hydra.runtime.choices.get(g) for g in GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def _first_cell(preset: str) -> tuple[list[str], object]:
    """The first cell the validation pass lets train (a grid's refused pairings are recorded, not trained)."""
    for cell in _cells(preset):
        cfg, choices = _composed([f"experiment={preset}", "scale=paper", *cell])
        try:
            return cell, validate(cfg, choices, GPU)
        except IncompatiblePairing:
            continue
    raise AssertionError(f"no cell of {preset} passes")
