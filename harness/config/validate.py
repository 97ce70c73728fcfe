"""The one validation pass: every check that can run before anything is built, trained or logged.

In order, cheapest first; each refusal is a one-line ConfigError naming the key and the fix:
0. ``optim.tuned`` (harness/config/tuned.py): the file holds this cell, whose values replace the config's;
1. every interpolation resolves;
2. every node against its schema (harness/config/schema.py): every group present, unknown keys, types,
   finite numbers, ranges (declared in the signatures, harness/ranges.py, and the plain nodes'), a
   ``_target_`` that is its group's interface, the Trainer keys conf/trainer sets;
3. the tracking store (parsed, whole, an sqlite file or creatable, a server that answers) and the
   directories a run writes;
4. the run's objects built dry: tokenizer, task, data source, and the whole model on torch's
   ``meta`` device, so each constructor's own checks run (head dims, windows, the pos × attn
   pairing) and the parameter count is exact, with nothing allocated;
5. resources: the corpus splits (sizes only; nothing read) hold the windows, evaluation lengths fit
   the validation split, a GPU is there when asked for, CPU processes fit the cores, and the run
   rehearsed on meta (harness/config/rehearsal.py) fits this machine's memory and an hour a step; a run
   for a GPU, checked for a GPU of a named size (``--check --gpu-memory 80GB``), is estimated for that GPU
   instead (harness/config/resources.py ``gpu_estimate``), and needs no GPU here.
Nothing here imports Lightning or MLflow: a refusal costs the imports of torch and Hydra only.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.config import schema
from harness.config.budget import Budget, budget_of
from harness.config.catalog import INTERFACES, check_interface
from harness.config.compose import preset_scales
from harness.config.instantiate import instantiate, instantiate_option
from harness.config.layers import GROUPS as LAYERED
from harness.config.layers import KEY as LAYERS
from harness.config.layers import layer_targets, pattern_unit
from harness.config.phases import checked_phases, final_model, final_scheme
from harness.config.resources import (
    PLAIN,
    Footprint,
    GpuEstimate,
    NamedGpu,
    SchemeTerms,
    check_gpu,
    check_memory,
    gpu_estimate,
)
from harness.config.tuned import tuned_values
from harness.errors import ConfigError
from harness.paths import CONF
from harness.record.preflight import store_to_write
from harness.record.store import check_writable_dir
from positional.rope_scaling import as_field_of

if TYPE_CHECKING:
    from harness.config.deferred import Constructions


@dataclass(frozen=True)
class Checked:
    """A config that passed every check, with the typed settings and the cheap objects it names."""

    cfg: DictConfig
    choices: dict[str, str]  # config-group option names (pos, attn, task, data), for names and tags
    uri: str  # the tracking store
    run: schema.RunSettings
    data: schema.DataSettings
    eval: schema.EvalSettings
    report: schema.ReportSettings
    logger: schema.LoggerSettings
    trainer: schema.TrainerSettings
    model: Any  # harness.model.transformer.ModelConfig
    tokenizer: Any
    task: Any
    source: Any  # the corpus source, not loaded
    n_params: int
    progress: schema.ProgressSettings = schema.ProgressSettings()
    gpu: GpuEstimate | None = None  # a GPU run checked for a named GPU: its largest step's estimate
    budget: Budget | None = None  # tokens, epochs, FLOPs and GPU-hours (harness/config/budget.py)
    phases: tuple = ()  # harness.model.phases.Phase: the run's positional phases (harness/config/phases.py)
    documents: bool = False  # the text windows carry document_ids (``_check_documents``)
    deferred: Any = None  # harness.config.deferred.Deferred: the model, constructed once; build materialises it
    optimizer: Any = None  # the optimizer's factory (optim.optimizer, partial), checked over one scalar
    schedule: Any = None  # the learning-rate schedule (optim.schedule)

    @property
    def seed(self) -> int:
        return self.run.seed


def validate(cfg: DictConfig, choices: dict[str, str], gpu: NamedGpu | None = None,
             constructions: Constructions | None = None) -> Checked:
    """``gpu``: check a GPU run for a GPU of that size (``--check --gpu-memory``) rather than for this machine.
    ``constructions``: a sweep's, where its preflight keeps each cell's model for the cell (config/deferred.py)."""
    _check_preset(choices.get("experiment"), choices.get("scale"))
    tuned = _apply_tuned(cfg, choices)  # optim.tuned: this cell's tuned lr and warmup, then checked like any value
    try:
        return _validate(cfg, choices, gpu, constructions)
    except ConfigError as e:
        key = next((k for k in tuned if str(e).startswith(f"{k}=")), None)
        if key is None:
            raise
        raise type(e)(f"{e} (the value comes from optim.tuned={tuned[key]})") from None


def _apply_tuned(cfg: DictConfig, choices: dict[str, str]) -> dict[str, str]:
    """Write this cell's tuned values into ``cfg`` when ``optim.tuned`` names a best.json (harness/config/tuned.py);
    returns the keys written, each with the file it came from (a refusal of one of them names the file)."""
    path = OmegaConf.select(cfg, "optim.tuned", default=None)
    if path is None:
        return {}
    values = tuned_values(str(path), choices["pos"], choices["attn"])
    for key, value in values.items():
        if OmegaConf.select(cfg, key, default=None) is None:
            raise ConfigError(f"optim.tuned={path} sets {key}, which this config does not have; "
                              "use a best.json tuned with the same optim and schedule, or drop optim.tuned")
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    return {key: str(path) for key in values}


def _validate(cfg: DictConfig, choices: dict[str, str], gpu: NamedGpu | None,
              constructions: Constructions | None) -> Checked:
    values = resolved(cfg)
    check_nodes(values, choices)
    settings, trainer = _settings(values)
    uri = store_to_write(settings["logger"].tracking_uri)
    _check_dirs(settings["checkpoint"])
    tokenizer = instantiate(cfg.tokenizer)
    task = instantiate(cfg.task, tokenizer=tokenizer)
    source = instantiate(cfg.data.source)
    _check_source_reads(settings["data"], source, choices.get("data", "this data"))
    _check_token_source(source, tokenizer, task, choices)
    optimizer, schedule = dry_optimizer(cfg)
    if settings[""].diagnostics:
        _check_diagnosable(cfg.attn._target_, choices.get("attn", cfg.attn._target_))
        for name, target in layer_targets(cfg.attn, "attn").items():  # attn.layers: every variant it names
            _check_diagnosable(target, name)
    on_gpu = trainer.accelerator in ("gpu", "cuda")
    for_gpu = _gpu_phases(trainer, tokenizer.vocab_size, settings["data"], task, settings["eval"].tune_length) \
        if on_gpu and gpu else None
    model_cfg, deferred = dry_model(cfg, tokenizer, task, settings["data"], gpu=gpu, for_gpu=for_gpu,
                                    constructions=constructions)
    model = deferred.meta
    data, lengths = settings["data"], settings["eval"].lengths
    documents = _check_documents(model_cfg, source, tokenizer, task, choices)
    phases = checked_phases(cfg, model, task, data, trainer.max_steps)  # each phase's scheme built dry
    if settings[""].export == "hf":
        _check_exportable(final_model(phases, model), task)
    check_extrapolation(settings["eval"], task, final_scheme(phases, model), choices.get("task", "this task"))
    tune_length = settings["eval"].tune_length
    train_tokens = _check_splits(source, task, tokenizer, data, lengths, tune_length)
    _check_rank_slices(source, task, data, trainer)
    budget = budget_of(settings["budget"], trainer, data, task, model_cfg, tokenizer.vocab_size, model.num_params(),
                       train_tokens, settings[""].paper)
    _check_device(trainer, for_named_gpu=gpu is not None)
    estimate = _check_memory(cfg, values, model, model_cfg, tokenizer, task, data, lengths, tune_length,
                             for_gpu, gpu) if for_gpu or not on_gpu else None
    return Checked(cfg, choices, uri, settings[""], data, settings["eval"], settings["report"], settings["logger"],
                   trainer, model_cfg, tokenizer, task, source, model.num_params(), settings["progress"], estimate,
                   budget, tuple(phases), documents, deferred, optimizer, schedule)


def _check_memory(cfg, values, model, model_cfg, tokenizer, task, data, lengths, tune_length, for_gpu, gpu):
    """A GPU run checked for a named GPU: the estimate of its largest step against it (returned); a CPU run: the
    model rehearsed on meta against this machine's memory (a GPU's kernels, autocast, are not on meta)."""
    if for_gpu:
        variant = variant_bytes_per_layer(cfg, model, task, data)
        return check_gpu(for_gpu(model.num_params(), model_cfg, SchemeTerms.of(model.pos), variant), gpu)
    from harness.config.rehearsal import check_phases, rehearse  # lazy: torch, once the cheap checks passed

    check_phases(rehearse(model, values, data.batch_size, task.sequence_tokens(data.seq_len),
                          _evaluations(task, data, lengths), _finetune(data, tune_length)), on_gpu=False)
    return None


def _check_documents(model_cfg, source, tokenizer, task, choices: dict[str, str]) -> bool:
    """Whether the run's text windows must carry document_ids (model.restart_positions, model.document_mask): then
    the source must know where its documents start and the tokenizer keep byte offsets. A synthetic task's
    example is one document (positions 0 … T−1, nothing to mask): nothing to pass."""
    keys = [k for k in ("restart_positions", "document_mask") if getattr(model_cfg, k)]
    if not keys or task.scores_sequences:
        return False
    asked = f"model.{keys[0]}=true"
    if not hasattr(source, "document_starts"):
        raise ConfigError(f"{asked} needs a data source that passes where its documents start, and "
                          f"data={choices.get('data', 'this source')} does not (data=embedded: each docstring and "
                          f"pydoc topic; data=text: each file); use one of those or drop {asked}")
    if tokenizer.config_name() != "byte":
        raise ConfigError(f"{asked} maps document starts from bytes to tokens one to one, which only "
                          f"tokenizer=byte does (tokenizer={tokenizer.config_name()} encodes the split whole); "
                          "use tokenizer=byte or drop it")
    return True


def _check_exportable(model, task) -> None:
    """export=hf: the final model must have transformers' form, and safetensors must be there to write it."""
    import importlib.util

    from harness.pretrained.export import refusal

    why = refusal(model, task.causal)
    if why:
        raise ConfigError(f"export=hf: {why}; drop export or change the model")
    if importlib.util.find_spec("safetensors") is None:
        raise ConfigError("export=hf writes model.safetensors, and safetensors is not installed: "
                          "pip install 'posbench[hf]' (or drop export)")


def _settings(values: dict) -> tuple[dict, schema.TrainerSettings]:
    """The plain schema nodes (data, eval, report, …, "" for the top level) and the trainer's, cross-checked."""
    settings = {path: cls(**(values.get(path, {}) if path else _plain_top(values)))
                for path, cls in schema.PLAIN.items()}
    trainer = _trainer_settings(values["trainer"])
    if settings["progress"].mode != "auto" and not trainer.enable_progress_bar:
        raise ConfigError(f"progress.mode={settings['progress'].mode} asks for progress but "
                          "trainer.enable_progress_bar=false turns it off; drop one of the two")
    return settings, trainer


def _gpu_phases(trainer: schema.TrainerSettings, vocab: int, data: schema.DataSettings, task,
                tune_length: int | None):
    """(parameters, model config, scheme terms) -> the GPU estimates of a training step and a fine-tune step."""
    length = task.sequence_tokens(data.seq_len)
    phases = [("a training step", f"data.batch_size={data.batch_size} or data.seq_len={data.seq_len}",
               data.batch_size, length)]
    if tune_length:
        batch, tokens = _finetune(data, tune_length)
        phases.append((f"fine-tuning at eval.finetune_length={tune_length}", f"eval.finetune_length={tune_length}",
                       batch, tokens))

    def estimates(n_params: int, model_cfg, scheme: SchemeTerms = PLAIN, variant: int = 0) -> list[GpuEstimate]:
        return [gpu_estimate(what, shrink, n_params, model_cfg, vocab, b, t, trainer.precision, scheme,
                             variant * b * t // (data.batch_size * length))  # measured at the training step's tokens
                for what, shrink, b, t in phases]
    return estimates


def variant_bytes_per_layer(cfg: DictConfig, model, task, data: schema.DataSettings) -> int:
    """What one layer of the run's attention variant keeps for a training step beyond softmax in a fused kernel,
    in fp32 bytes: the meta rehearsal's peak of the model (built on meta) cut to 2 layers minus to 1, with its
    variants and with softmax's (what accumulates layer by layer, not what one layer holds for a moment); the
    run's own construction, cut, so no scheme is built again. 0 for softmax itself."""
    import torch
    from torch import nn

    from attention.softmax import Softmax
    from harness.config.rehearsal import rehearse

    variant = model.variants[0]
    if isinstance(variant, Softmax) and variant.backend != "math":
        return 0
    values, length = resolved(cfg), task.sequence_tokens(data.seq_len)
    with torch.device("meta"):
        fused = Softmax(variant.shape)

    def peak(layers: int, attn: Softmax | None = None) -> int:
        cut = copy.deepcopy(model)
        cut.blocks, cut.variants = nn.ModuleList(list(cut.blocks)[:layers]), cut.variants[:layers]
        if attn is not None:
            for block in cut.blocks:
                block.attn.variant = attn
            cut.variants = [attn] * layers
        return rehearse(cut, values, data.batch_size, length, [], None)[0].needs

    return max(0, (peak(2) - peak(1)) - (peak(2, fused) - peak(1, fused)))


def _evaluations(task, data: schema.DataSettings, lengths: list[int]) -> list[tuple[str, int, int, int, int]]:
    """(the key that lists it, the length listed, the model's sequence length, the batch, the batches) of each
    final evaluation: a synthetic task scores ``task.eval_lengths`` at data.batch_size, task.eval_examples
    examples each; text windows keep the training tokens per batch (harness/model/evaluate.py), counted
    here as one batch (a lower bound of the work)."""
    if task.scores_sequences:
        batches = -(-task.eval_examples // data.batch_size)
        return [("task.eval_lengths", n, tokens, data.batch_size, batches)
                for n, tokens in zip(task.eval_lengths, task.evaluation_tokens(lengths), strict=True)]
    return [("eval.lengths", n, tokens, max(1, data.batch_size * data.seq_len // n), 1)
            for n, tokens in zip(lengths, task.evaluation_tokens(lengths), strict=True)]


def _finetune(data: schema.DataSettings, length: int | None) -> tuple[int, int] | None:
    """(batch, length) of a fine-tune step: as many tokens a batch as training (harness/model/extrapolation.py)."""
    return (max(1, data.batch_size * data.seq_len // length), length) if length else None


def _check_source_reads(data: schema.DataSettings, source, name: str) -> None:
    """A source-specific key (data.path, data.download) set for a source that does not read it would be
    ignored: refused instead (e.g. ``+data.path=...`` with data=embedded)."""
    reads = inspect.signature(type(source).__init__).parameters
    defaults = schema.DataSettings()
    for key in schema.SOURCE_KEYS:
        if getattr(data, key) != getattr(defaults, key) and key not in reads:
            raise ConfigError(f"data={name} does not read data.{key}; choose a data source that does "
                              f"(data=text data.path=FILE_OR_DIR, data=enwik8, data=hf) or drop data.{key}")


def _check_token_source(source, tokenizer, task, choices: dict[str, str]) -> None:
    """Pre-tokenized shards (data=tokens) hold text windows' ids, written with one tokenizer: refuse another, and
    a synthetic task (which makes its own examples)."""
    if not hasattr(source, "check_tokenizer"):
        return
    if task.scores_sequences:
        task_name = choices.get("task", type(task).config_name())
        raise ConfigError(f"data={choices.get('data', 'tokens')} holds token ids of text for task=mlm or task=clm; "
                          f"task={task_name} makes its own examples: drop data=tokens")
    source.check_tokenizer(tokenizer, type(tokenizer).config_name())


def resolved(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # an interpolation that does not resolve (a missing key, a bad resolver)
        raise ConfigError(f"the config does not resolve: {' '.join(str(e).split())}; "
                          "check the ${...} references you set (python run.py --cfg job prints the config)") from None


def _check_preset(name: str | None, scale: str | None = None) -> None:
    """``experiment`` and its scale (conf/experiment/<preset>/scale/) are optional, so Hydra skips an option that does
    not exist: refuse a preset that is not there, and a scale that preset has no sizes for (e.g. scale=smoke)."""
    presets = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    if name in (None, "null"):
        return
    if name not in presets:
        raise ConfigError(f"experiment={name} is not a preset; use one of experiment={', '.join(presets)}")
    scales = preset_scales(name)
    if scale and scale not in scales:
        raise ConfigError(f"experiment={name} has no scale={scale} (conf/experiment/{name}/scale/); use one of "
                          f"scale={', '.join(scales)}")


# ---------------------------------------------------------------- 2. every node against its schema


def missing_group(group: str) -> str:
    """The line for a run without one of the groups it needs (``~pos``, ``pos=null``, a preset that drops one)."""
    return (f"the config has no {group} (a run needs every group: {', '.join(schema.GROUPS)}); "
            f"pick one with {group}=NAME (python run.py --list lists them)"
            f"{', e.g. pos=none for no positions' if group == 'pos' else ''}")


def check_nodes(values: dict, choices: dict[str, str]) -> None:
    missing = [g for g in schema.GROUPS if not isinstance(values.get(g), dict) or not _chosen(g, values[g])]
    if missing:  # ~pos, pos=null, or a preset that drops one
        raise ConfigError(missing_group(missing[0]))
    top = schema.plain_fields(schema.RunSettings)
    known = [*top, *schema.GROUPS, *(k for k in schema.PLAIN if k)]
    schema.check_known("", list(values), known, "the config")
    plain_first = sorted(values, key=lambda k: k not in schema.PLAIN)  # targets interpolate data.seq_len & co
    for key in plain_first:
        value = values[key]
        if key in top:
            schema.check_value(key, value, top[key])
        elif isinstance(value, dict):
            check_node(key, value, choices)
        else:
            raise ConfigError(f"{key}={value!r} replaces the config group {key}; pick an option with {key}=NAME "
                              f"(python run.py --help lists them) or set one key with {key}.KEY=VALUE")


def _chosen(group: str, node: dict) -> bool:
    """Whether ``node`` is an option of ``group``, not only the keys conf/config.yaml gives every pos node
    (``~pos`` leaves those)."""
    from positional.randomized import KEYS

    return group != "pos" or bool(set(node) - set(KEYS))


def check_node(path: str, node: dict, choices: dict[str, str]) -> None:
    if "_target_" in node:
        _check_target(path, node, choices)
        return
    plain = schema.PLAIN.get(path)
    if plain is None:  # free-form metadata (a preset's claim)
        return
    fields = schema.plain_fields(plain)
    schema.check_known(path, list(node), list(fields), f"{path} ({choices.get(path, path)})")
    for key, value in node.items():
        child = f"{path}.{key}"
        if isinstance(value, dict) and ("_target_" in value or child in schema.PLAIN):
            check_node(child, value, choices)
        else:
            schema.check_value(child, value, fields[key])


def _check_target(path: str, node: dict, choices: dict[str, str]) -> None:
    what = f"{path}={choices[path]}" if path in choices else f"{path} ({node['_target_']})"
    keys = [k for k in node if not k.startswith("_")]
    if path in LAYERED and LAYERS in keys:  # pos.layers: read by the harness (harness/config/layers.py)
        pattern_unit(node[LAYERS], path)
        keys.remove(LAYERS)
    if path == "trainer":  # typed by TrainerSettings: importing Lightning to read its signature takes seconds
        fields, open_kwargs = _trainer_fields(keys), False
    else:
        target = _locate(path, node["_target_"])
        if path in INTERFACES:
            check_interface(path, target, node["_target_"])
        fields, open_kwargs = schema.signature_schema(target, schema.SUPPLIED.get(path, ()))
        if path == "pos":  # pos.randomize & co: the wrapper's keys, for any scheme (positional/randomized.py)
            from positional.randomized import options

            fields = {**fields, **schema.signature_schema(options)[0]}
    if not open_kwargs:
        schema.check_known(path, keys, list(fields), what)
    for key in keys:
        if isinstance(node[key], dict) and "_target_" in node[key]:  # an object handed in (pos.scaling): its own keys
            _check_target(f"{path}.{key}", node[key], choices)
        else:
            try:
                schema.check_value(f"{path}.{key}", node[key], fields.get(key, Any))
                if path != "trainer":  # the trainer's counts are bounded by TrainerSettings (trainer.max_steps)
                    schema.check_magnitude(f"{path}.{key}", node[key], fields.get(key, Any))
            except ConfigError as e:
                raise ConfigError(f"{e}{_nested_group_hint(path, key)}") from None
    if path == "optim.optimizer":
        _check_optimizer_ranges(node)


def _locate(path: str, target: str):
    try:
        return get_object(target)
    except Exception:
        raise ConfigError(f"{path}._target_={target!r} cannot be imported; use a class of this project or "
                          "torch (e.g. positional.rope.Rope)") from None


def _trainer_fields(keys: list[str]) -> dict[str, Any]:
    fields = schema.plain_fields(schema.TrainerSettings)
    unknown = [k for k in keys if k not in fields]
    if not unknown:
        return fields
    for key in unknown:  # a typo of a known key is refused without importing Lightning (seconds)
        if difflib.get_close_matches(key, list(fields), n=1, cutoff=0.8):
            schema.check_known("trainer", [key], list(fields), "trainer")
    return {**{name: Any for name in schema.trainer_arguments()}, **fields}


def _trainer_settings(node: dict) -> schema.TrainerSettings:
    known = schema.plain_fields(schema.TrainerSettings)
    missing = [f.name for f in dataclasses.fields(schema.TrainerSettings)
               if f.default is dataclasses.MISSING and f.name not in node]
    if missing:
        raise ConfigError(f"trainer.{missing[0]} is missing (removed with ~trainer.{missing[0]}?), and Lightning's "
                          f"default is not this harness's; set trainer.{missing[0]}=VALUE (conf/trainer/cpu.yaml "
                          "has the defaults)")
    return schema.TrainerSettings(**{k: v for k, v in node.items() if k in known})


def _check_optimizer_ranges(node: dict) -> None:
    for key, rule, ok in schema.OPTIMIZER_RANGES:
        if key in node and node[key] is not None and not ok(node[key]):
            raise ConfigError(f"optim.optimizer.{key}={node[key]} {rule}")


def _plain_top(values: dict) -> dict:
    return {k: values[k] for k in schema.plain_fields(schema.RunSettings) if k in values}


# ---------------------------------------------------------------- 3. where the run writes


def _check_dirs(checkpoint: schema.CheckpointSettings) -> None:
    if checkpoint.dir:
        check_writable_dir(Path(checkpoint.dir).expanduser().absolute(), "checkpoint.dir",
                           "set checkpoint.dir to a directory you can write")


# ---------------------------------------------------------------- 4. the model, built without memory


def dry_optimizer(cfg: DictConfig) -> tuple[Any, Any]:
    """The schedule, and the optimizer over one scalar: their own checks run before the Trainer exists. Returns
    (the optimizer's factory, the schedule), which build uses for the model's parameters."""
    import torch

    schedule, optimizer = instantiate(cfg.optim.schedule), instantiate(cfg.optim.optimizer)
    try:
        optimizer([torch.zeros(1, requires_grad=True)])
    except (ValueError, TypeError) as e:  # torch's own argument checks
        raise ConfigError(f"optim.optimizer: {' '.join(str(e).split())}; fix that value of optim.optimizer") from None
    return optimizer, schedule


def dry_model(cfg: DictConfig, tokenizer, task, data: schema.DataSettings, gpu: NamedGpu | None = None,
              for_gpu=None, constructions: Constructions | None = None):
    """The model constructed on torch's meta device, once for the run (harness/config/deferred.py: build
    materialises this construction): every constructor check runs, nothing is allocated. First, since
    a huge model takes long to lay out even on meta, the blocks' footprint (a lower bound) against this
    machine's memory, or, for a GPU run checked for a named GPU (``for_gpu``: ``_gpu_phases``), against it."""
    from harness.config.deferred import Constructions
    from harness.model.transformer import Transformer

    model_cfg, length = instantiate(cfg.model), task.sequence_tokens(data.seq_len)
    blocks = Footprint.of_blocks(model_cfg, tokenizer.vocab_size)
    if for_gpu:
        check_gpu(for_gpu(blocks.n_params, model_cfg), gpu, lower_bound=True)
    else:
        check_memory(blocks, data.batch_size, length, on_gpu=False)
    pos, attn = instantiate_option(cfg.pos, "pos"), instantiate_option(cfg.attn, "attn")
    key = json.dumps([OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "pos", "attn")]
                     + [tokenizer.vocab_size, length, task.causal], sort_keys=True, default=repr)
    return model_cfg, (constructions or Constructions()).construct(key, lambda: Transformer(
        model_cfg, tokenizer.vocab_size, length, task.causal, pos=pos, attn=attn))


def check_extrapolation(settings: schema.EvalSettings, task, pos, task_name: str) -> None:
    """eval.stride and eval.same_targets read a causal model's next-token losses; eval.scalings names
    length scalings the scheme declares (``length_scalings``), each built dry here at every length."""
    for key in ("stride", "same_targets"):
        if getattr(settings, key) and not task.causal:
            raise ConfigError(f"eval.{key} scores tokens with only the context before them, which a bidirectional "
                              f"task={task_name} does not have (it sees both sides); use task=clm or drop eval.{key}")
    if not settings.scalings:
        return
    if not pos.length_scalings:
        with pos.rescaled(settings.scalings[0], settings.lengths[0]):  # the scheme's own refusal, with its reason
            pass
    unknown = [m for m in settings.scalings if m not in pos.length_scalings]
    if unknown:
        raise ConfigError(f"eval.scalings: {unknown} are not length scalings of pos={pos.config_name()}; "
                          f"use some of {', '.join(pos.length_scalings)}")
    lengths = [*settings.lengths, *([settings.finetune_length] if settings.finetune_length else [])]
    for method in settings.scalings:
        for length in lengths:
            try:
                with pos.rescaled(method, length):
                    pass
            except ConfigError as e:  # the scheme's own refusal (e.g. longrope without its lists)
                raise ConfigError(f"eval.scalings={method} at L={length}: {as_field_of('pos.scaling', str(e))}; set "
                                  f"them with pos/scaling={method} pos.scaling.<option>=..., or drop {method} from "
                                  "eval.scalings") from None


def _nested_group_hint(path: str, key: str) -> str:
    """Where ``path.key`` is a config group of its own (pos.scaling: conf/pos/scaling/), how to pick one."""
    names = sorted(p.stem for p in (CONF / path / key).glob("*.yaml")) if path in ("pos", "attn", "task") else []
    return f"; pick one with {path}/{key}=<name>: {', '.join(names)}" if names else ""


def _check_diagnosable(target: str, name: str) -> None:
    """diagnostics=true draws the weights each layer applies: the variant must say what they are."""
    if not _locate("attn", target).implies_weights():
        raise ConfigError(f"diagnostics=true needs the attention weights, which attn={name} does not form "
                          "(it has no implied_weights); set diagnostics=false or implement it")


# ---------------------------------------------------------------- 5. resources


def _check_splits(source, task, tokenizer, data: schema.DataSettings, lengths: list[int],
                  finetune_length: int | None = None) -> int | None:
    """The training split's tokens where they are known before tokenizing (bytes, or shards' ids), checked
    against the windows and lengths asked for; None where they are not."""
    train, val = source.sizes()
    if not tokenizer.byte_level:  # token counts of other tokenizers are unknown until the text is read
        return train if hasattr(source, "check_tokenizer") else None  # shards: their sizes are token counts
    task.check_corpus(train, val, data.seq_len)
    if lengths and task.scores_sequences:
        raise ConfigError(f"eval.lengths={lengths} scores text windows; a synthetic task evaluates at "
                          "task.eval_lengths instead: drop eval.lengths, or set task.eval_lengths=[...]")
    too_long = [n for n in lengths if n > val]
    if too_long:
        raise ConfigError(f"eval.lengths: {too_long} exceed the validation split ({val} tokens), so a window would "
                          f"be mostly padding; use lengths up to {val}, or a larger corpus")
    if finetune_length and finetune_length > train:
        raise ConfigError(f"eval.finetune_length={finetune_length} exceeds the training split ({train} tokens); "
                          f"fine-tune at most {train} tokens, or use a larger corpus")
    return train


def _check_rank_slices(source, task, data: schema.DataSettings, trainer: schema.TrainerSettings) -> None:
    """Shards are read one contiguous slice per DDP rank (harness/data/shards.py): every rank's slice must hold
    more than one window, checked here for the world the trainer will start — not in rank 1 after rank 0 started
    (rank 0 was then killed and the run left RUNNING)."""
    if not hasattr(source, "check_tokenizer"):  # text corpora: every rank samples windows from the whole split
        return
    from harness.data.shards import rank_slice

    world = (_device_count(trainer.devices) or 1) * trainer.num_nodes
    if world < 2:
        return
    train, _ = source.sizes()
    length = task.sequence_tokens(data.seq_len)
    smallest = min(end - start for start, end in (rank_slice(train, r, world) for r in range(world)))
    if smallest <= length:
        raise ConfigError(f"each of the {world} DDP ranks (trainer.devices × trainer.num_nodes) reads its own "
                          f"{smallest:,} of the shards' {train:,} training tokens, not more than one window of "
                          f"{length}; lower data.seq_len, use fewer ranks, or prepare a larger corpus")


def _check_device(trainer: schema.TrainerSettings, for_named_gpu: bool = False) -> None:
    """``for_named_gpu``: checked for a GPU of a named size (``--gpu-memory``), which this machine need not have."""
    import torch

    if trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available() and not for_named_gpu:
        raise ConfigError(f"trainer.accelerator={trainer.accelerator} but no CUDA device is visible; use "
                          "trainer=cpu, or trainer=ddp trainer.accelerator=cpu for DDP over CPU processes")
    on_cpu = trainer.accelerator == "cpu" or (trainer.accelerator == "auto" and not torch.cuda.is_available())
    processes, cores = _device_count(trainer.devices), os.cpu_count() or 1
    if on_cpu and processes and processes > cores:  # each CPU process computes on its own cores: more would thrash
        raise ConfigError(f"trainer.devices={trainer.devices} starts {processes} training processes on this "
                          f"machine's {cores} CPU cores; use trainer.devices={cores} at most (more machines: "
                          "trainer.num_nodes=N)")


def _device_count(devices) -> int | None:
    """Processes this node starts for ``trainer.devices`` (a count, "N", a list of ids or "0,1"); None: auto/-1."""
    if isinstance(devices, list):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if isinstance(devices, str):
        return int(devices) if devices.strip().isdigit() else None
    return devices if devices > 0 else None
