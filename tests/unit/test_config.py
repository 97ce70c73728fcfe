"""Every option of every config group composes and instantiates."""

from dataclasses import replace

import pytest
import torch

from attention.base import AttentionVariant
from harness.config.load import load
from harness.data.objectives import Task
from harness.data.tasks import ScoredTask
from harness.model.transformer import ModelConfig
from positional.base import PositionalScheme, Shape
from tests.helpers import ROOT

GROUPS = sorted(p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name not in ("experiment", "hydra"))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((ROOT / "conf" / g).glob("*.yaml"))]
SHAPE = Shape(d_model=32, n_heads=2, n_layers=2, max_len=64, causal=False)


def test_groups_present():
    assert {"pos", "attn", "model", "data", "task", "trainer", "logger", "optim", "tokenizer"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_instantiates(group, option, tmp_path, monkeypatch):
    spec = load([f"{group}={option}"])
    if group in ("pos", "attn"):
        choice = getattr(spec, group)
        causal = getattr(choice.option.target, "bidirectional_refusal", None) is not None  # FoX: causal only
        built = choice.factory()(replace(SHAPE, causal=causal))
        assert isinstance(built, PositionalScheme if group == "pos" else AttentionVariant)
        assert type(built).config_name() == option  # conf/<g>/<name>.yaml pairs with <g>/<name>.py
    elif group == "model":
        assert isinstance(spec.model, ModelConfig)
    elif group == "data":
        assert hasattr(spec.source.build(), "load")
    elif group == "task":
        task = spec.task.build(tokenizer=spec.tokenizer.build())
        assert type(task).config_name() == option  # conf/task/<name>.yaml names the class's own name
        assert isinstance(task, ScoredTask if task.scores_sequences else Task)  # what the pipeline will call
    elif group == "optim":
        spec.schedule.build()
        assert callable(spec.optimizer.factory())
    elif group == "trainer":
        from harness.config.build import trainer_of

        trainer = spec.trainer
        if trainer.accelerator == "gpu" and not torch.cuda.is_available():  # the GPU presets, on a CPU machine
            trainer = load([f"{group}={option}", "trainer.accelerator=cpu"]).trainer
        assert trainer_of(trainer, logger=False, callbacks=[]).max_steps == spec.trainer.max_steps
    elif group == "logger":
        assert spec.logger.experiment
    elif group == "tokenizer":
        monkeypatch.setattr("harness.data.corpus.CACHE", tmp_path / "cache")  # a trained vocabulary's cache
        tok = tokenizer_option(option, tmp_path)
        assert tok.decode(tok.encode(b"posbench")) == "posbench"  # a round trip
        assert len({tok.pad_id, tok.mask_id}) == 2 and max(tok.pad_id, tok.mask_id) < tok.vocab_size
    elif group == "scale":
        # a scale only picks conf/experiment/<preset>/scale/<scale>.yaml: without experiment=..., nothing moves
        assert spec.values["scale"] == {} and spec.values == load([]).values
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
        PreTrainedTokenizerFast(
            tokenizer_object=core, pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]"
        ).save_pretrained(str(tmp_path / "saved"))
        return load(["tokenizer=hf", f"tokenizer.name={tmp_path / 'saved'}"]).tokenizer.build()
    tok = load(
        [f"tokenizer={option}", *(["tokenizer.vocab_size=300"] if option in ("bpe", "wordpiece") else [])]
    ).tokenizer.build()
    tok.fit(SimpleNamespace(train=text, val=text))
    return tok


def test_a_check_creates_nothing_it_only_tries(tmp_path):
    """The folders a run will write (its store's, its checkpoints') are tried, not made: a check that passes, or a
    resume refused because nothing is there, leaves the file system as it was."""
    from harness.config.check import check
    from harness.errors import ConfigError
    from harness.record.resume import plan_resume
    from tests.helpers import spec

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    checked = check(spec(f"logger.tracking_uri={uri}", f"checkpoint.dir={tmp_path / 'ckpt'}"))
    with pytest.raises(ConfigError, match="resume=true: no checkpoint for this config"):
        plan_resume(checked.spec.values, checked.uri, "require")
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_pins_a_presets_axis_however_it_sets_its_key():
    """One rule for a run without -m, every sweeper and the sweep's name: ``seed=5``, ``++seed=5`` and ``~seed`` pin
    the preset's seed axis (``~seed`` runs the default seed, it is not refused as a sweep over seed), and ``+a=…``
    or ``++a=…`` pins the preset's ``+a`` axis."""
    from harness.config.load import preset_axes

    assert load(["experiment=ablation", "pos=rope", "~seed"]).run.seed == 0
    arms = {"+experiment/drope/arm": "rope,drope", "seed": "0,1,2"}
    for pin in ("seed=5", "++seed=5", "~seed"):
        assert preset_axes(arms, ["+experiment/drope/arm=rope", pin]) == {}
    assert preset_axes(arms, ["++experiment/drope/arm=rope"]) == {"seed": "0,1,2"}
    assert preset_axes(None, ["seed=5"]) == {}
