"""Every option of every config group composes and instantiates."""

from dataclasses import replace

import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from attention.base import AttentionVariant
from harness.config.instantiate import instantiate_option
from harness.data.objectives import Task
from harness.data.tasks import ScoredTask
from harness.model.transformer import ModelConfig
from positional.base import PositionalScheme, Shape
from tests.helpers import ROOT, compose

GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name not in ("experiment", "hydra"))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((ROOT / "conf" / g).glob("*.yaml"))]
SHAPE = Shape(d_model=32, n_heads=2, n_layers=2, max_len=64, causal=False)


def test_groups_present():
    assert {"pos", "attn", "model", "data", "task", "trainer", "logger", "optim", "tokenizer"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, tmp_path, monkeypatch):
    cfg = compose([f"{group}={option}"])
    node = cfg[group]
    if group in ("pos", "attn"):
        target = get_class(node._target_)
        causal = getattr(target, "bidirectional_refusal", None) is not None  # FoX: defined for causal attention only
        built = instantiate_option(node, group)(replace(SHAPE, causal=causal))
        assert isinstance(built, PositionalScheme if group == "pos" else AttentionVariant)
        assert type(built).config_name() == option  # conf/<g>/<name>.yaml pairs with <g>/<name>.py
    elif group == "model":
        assert isinstance(instantiate(node), ModelConfig)
    elif group == "data":
        assert hasattr(instantiate(node.source), "load")
    elif group == "task":
        task = instantiate(node, tokenizer=instantiate(cfg.tokenizer))
        assert type(task).config_name() == option  # conf/task/<name>.yaml names the class's own name
        assert isinstance(task, ScoredTask if task.scores_sequences else Task)  # what the pipeline will call
    elif group == "optim":
        instantiate(node.schedule)
        assert callable(instantiate(node.optimizer))
    elif group == "trainer":
        if node.accelerator == "gpu" and not torch.cuda.is_available():  # the GPU presets, on a CPU machine
            node = compose([f"{group}={option}", "trainer.accelerator=cpu"]).trainer
        assert instantiate(node).max_steps == cfg.trainer.max_steps
    elif group == "logger":
        assert node.experiment
    elif group == "tokenizer":
        monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")  # a trained vocabulary's cache
        tok = tokenizer_option(option, tmp_path)
        assert tok.decode(tok.encode(b"posbench")) == "posbench"  # a round trip
        assert len({tok.pad_id, tok.mask_id}) == 2 and max(tok.pad_id, tok.mask_id) < tok.vocab_size
    elif group == "scale":
        # a scale only picks conf/experiment/<preset>/scale/<scale>.yaml: without experiment=..., nothing moves
        assert node == {} and without_hydra(cfg) == without_hydra(compose())
    else:
        pytest.fail(f"conf/{group}/ has no check here: say what its options must build")


def tokenizer_option(option: str, tmp_path):
    """The tokenizer ``option`` builds, given what it needs offline: a corpus to train on (bpe, wordpiece),
    a folder a tokenizer was saved to (hf)."""
    from types import SimpleNamespace

    from harness.data.subword import train_tokenizer

    text = b"posbench compares position encodings; every scheme trains on the same text.\n" * 200
    if option == "hf":
        from transformers import PreTrainedTokenizerFast

        core = train_tokenizer("wordpiece", text, 300, 1)
        PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", mask_token="[MASK]",
                                unk_token="[UNK]").save_pretrained(str(tmp_path / "saved"))
        return instantiate(compose(["tokenizer=hf", f"tokenizer.name={tmp_path / 'saved'}"]).tokenizer)
    tok = instantiate(compose([f"tokenizer={option}", "tokenizer.vocab_size=300"]).tokenizer
                      if option in ("bpe", "wordpiece") else compose([f"tokenizer={option}"]).tokenizer)
    tok.fit(SimpleNamespace(train=text, val=text))
    return tok


def without_hydra(cfg) -> dict:
    out = OmegaConf.to_container(cfg)
    del out["hydra"]
    return out
