"""Every option of every config group composes and instantiates."""


import pytest
import torch
from hydra.utils import instantiate

from attention.base import AttentionVariant
from harness.model.transformer import ModelConfig
from positional.base import PositionalScheme, Shape
from tests.conftest import ROOT, compose

GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name not in ("experiment", "hydra"))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((ROOT / "conf" / g).glob("*.yaml"))]
SHAPE = Shape(d_model=32, n_heads=2, n_layers=2, max_len=64, causal=False)


def test_groups_present():
    assert {"pos", "attn", "model", "data", "task", "trainer", "logger", "optim", "tokenizer"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, tmp_path):
    cfg = compose([f"{group}={option}"])
    node = cfg[group]
    if group in ("pos", "attn"):
        built = instantiate(node)(SHAPE)
        assert isinstance(built, PositionalScheme if group == "pos" else AttentionVariant)
        assert type(built).config_name() == option  # conf/<g>/<name>.yaml pairs with <g>/<name>.py
    elif group == "model":
        assert isinstance(instantiate(node), ModelConfig)
    elif group == "data":
        assert hasattr(instantiate(node.source), "load")
    elif group == "task":
        assert instantiate(node, tokenizer=instantiate(cfg.tokenizer)).name == option
    elif group == "optim":
        instantiate(node.schedule)
        assert callable(instantiate(node.optimizer))
    elif group == "trainer":
        if node.accelerator == "gpu" and not torch.cuda.is_available():  # the GPU presets, on a CPU machine
            node = compose([f"{group}={option}", "trainer.accelerator=cpu"]).trainer
        assert instantiate(node).max_steps == cfg.trainer.max_steps
    elif group == "logger":
        assert node.experiment
    else:
        assert instantiate(node) is not None
