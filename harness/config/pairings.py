"""Pairing rules: options that are each valid but cannot run together, refused with the reason before training.

The scheme × attention pairing itself is the variants' declaration (``AttentionVariant.refusal``), checked when the
model is built on meta (harness/model/layers.py ``check_layers``); here are the rules across the rest of the spec:
a source and the keys it reads, pre-tokenized shards and the tokenizer, packed documents, positional phases, the
length scalings an evaluation asks of the scheme, the export format and attention diagnostics.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
from typing import TYPE_CHECKING

import torch

from harness.config.spec import SOURCE_KEYS, Choice, Choices, Component, DataSettings, EvalSettings, RunSpec
from harness.data.objectives import Source, Task, Tokenizer
from harness.errors import ConfigError, IncompatiblePairing
from harness.model.layers import check_layers
from harness.model.transformer import ModelConfig, Transformer
from positional.base import PositionalScheme
from positional.rope_remapped import REMAPS
from positional.rope_scaling import as_field_of

if TYPE_CHECKING:  # harness.model.phases imports Lightning (seconds), which a refusal must not pay for
    from harness.model.phases import Phase


def check_source_reads(data: DataSettings, source: Source, name: str) -> None:
    """A source-specific key (data.path, data.download) set for a source that does not read it would be
    ignored: refused instead (e.g. ``+data.path=...`` with data=embedded)."""
    reads = inspect.signature(type(source).__init__).parameters
    defaults = DataSettings()
    for key in SOURCE_KEYS:
        if getattr(data, key) != getattr(defaults, key) and key not in reads:
            raise ConfigError(
                f"data={name} does not read data.{key}; choose a data source that does "
                f"(data=text data.path=FILE_OR_DIR, data=enwik8, data=hf) or drop data.{key}"
            )


def check_token_source(source: Source, tokenizer: Tokenizer, task: Task, choices: Choices) -> None:
    """Pre-tokenized shards (data=tokens) hold text windows' ids, written with one tokenizer: refuse another, and
    a synthetic task (which makes its own examples)."""
    check = getattr(source, "check_tokenizer", None)
    if check is None:
        return
    if task.scores_sequences:
        raise ConfigError(
            f"data={choices.data} holds token ids of text for task=mlm or task=clm; "
            f"task={choices.task} makes its own examples: drop data=tokens"
        )
    check(tokenizer, type(tokenizer).config_name())


def check_documents(model: ModelConfig, source: Source, tokenizer: Tokenizer, task: Task, data_name: str) -> bool:
    """Whether the run's text windows must carry document_ids (model.restart_positions, model.document_mask): then
    the source must know where its documents start and the tokenizer keep byte offsets. A synthetic task's
    example is one document (positions 0 … T−1, nothing to mask): nothing to pass."""
    keys = [k for k in ("restart_positions", "document_mask") if getattr(model, k)]
    if not keys or task.scores_sequences:
        return False
    asked = f"model.{keys[0]}=true"
    if not hasattr(source, "document_starts"):
        raise ConfigError(
            f"{asked} needs a data source that passes where its documents start, and "
            f"data={data_name} does not (data=embedded: each docstring and "
            f"pydoc topic; data=text: each file); use one of those or drop {asked}"
        )
    if tokenizer.config_name() != "byte":
        raise ConfigError(
            f"{asked} maps document starts from bytes to tokens one to one, which only "
            f"tokenizer=byte does (tokenizer={tokenizer.config_name()} encodes the split whole); "
            "use tokenizer=byte or drop it"
        )
    return True


def check_exportable(model: Transformer, task: Task, phases: tuple[Phase, ...] = ()) -> None:
    """export=hf: the final model must have transformers' form, trained without a length scaling the export would
    drop, and safetensors must be there to write it."""
    from harness.pretrained.export import refusal

    scaled = next((p for p in reversed(phases) if p.scaling or p.pos), None)
    if scaled is not None and scaled.scaling:
        raise ConfigError(
            f"export=hf writes the model's RoPE without a training-time scaling, and the run trains "
            f"its last phase under {scaled.scaling} ×{scaled.factor:g} (phases, at step {scaled.at}), "
            "which the export would drop; drop export or that phase"
        )
    why = refusal(model, task.causal)
    if why:
        raise ConfigError(f"export=hf: {why}; drop export or change the model")
    if importlib.util.find_spec("safetensors") is None:
        raise ConfigError(
            "export=hf writes model.safetensors, and safetensors is not installed: "
            "pip install 'posbench[hf]' (or drop export)"
        )


def check_diagnosable(attn: Choice) -> None:
    """diagnostics=true draws the weights each layer applies: every variant must say what they are."""
    for name, component in [(attn.name, attn.option), *attn.entries.items()]:
        if not getattr(component.target, "implies_weights", lambda: False)():
            raise ConfigError(
                f"diagnostics=true needs the attention weights, which attn={name} does not form "
                "(it has no implied_weights); set diagnostics=false or implement it"
            )


def check_extrapolation(settings: EvalSettings, task: Task, model: Transformer, task_name: str) -> None:
    """eval.stride and eval.same_targets read a causal model's next-token losses; eval.scalings names
    length scalings the model's final scheme declares (``length_scalings``), each built dry here at every length;
    Self-Extend and DCA only with attention that forms the logits they remap."""
    pos = model.pos
    for key in ("stride", "same_targets"):
        if getattr(settings, key) and not task.causal:
            raise ConfigError(
                f"eval.{key} scores tokens with only the context before them, which a bidirectional "
                f"task={task_name} does not have (it sees both sides); use task=clm or drop eval.{key}"
            )
    if not settings.scalings:
        return
    if not pos.length_scalings:
        with pos.rescaled(settings.scalings[0], settings.lengths[0]):  # the scheme's own refusal, with its reason
            pass
    unknown = [m for m in settings.scalings if m not in pos.length_scalings]
    if unknown:
        raise ConfigError(
            f"eval.scalings: {unknown} are not length scalings of pos={pos.config_name()}; "
            f"use some of {', '.join(pos.length_scalings)}"
        )
    remapped = next((m for m in settings.scalings if m in REMAPS), None)
    variant = next(  # a per-layer pattern's non-RoPE layers are not remapped
        (v for scheme, v in model.layers() if remapped in scheme.length_scalings and "content" not in v.accepts_bias),
        None,
    )
    if remapped and variant is not None:
        raise ConfigError(
            f"eval.scalings={remapped} remaps positions per query-key pair, a content logit bias, and "
            f"attn={variant.config_name()} cannot apply one ({variant.bias_refusals.get('content', 'no T×T logits')}); "
            f"use attn=softmax or drop {remapped} from eval.scalings"
        )
    lengths = [*settings.lengths, *([settings.finetune_length] if settings.finetune_length else [])]
    for method in settings.scalings:
        for length in lengths:
            try:
                with pos.rescaled(method, length):
                    pass
            except ConfigError as e:  # the scheme's own refusal (e.g. longrope without its lists)
                raise ConfigError(
                    f"eval.scalings={method} at L={length}: {as_field_of('pos.scaling', str(e))}; set "
                    f"them with pos/scaling={method} pos.scaling.<option>=..., or drop {method} from "
                    "eval.scalings"
                ) from None


# ---------------------------------------------------------------- positional phases


def checked_phases(spec: RunSpec, model: Transformer, task: Task) -> tuple[Phase, ...]:
    """The run's ``Phase`` list, each phase's scheme built on meta against ``model`` (built on meta): its pairing
    with every layer's attention variant, its scalings; a scheme with trained parameters is refused on either side
    of a boundary (its weights would be lost or start untrained, and one run's checkpoints would hold other keys)."""
    if not spec.phases:
        return ()
    from harness.model.phases import Phase

    _check_trainable(model.pos, f"pos={spec.pos.option.name}, the run's own scheme")
    phases, previous, scheme = [], 0, model.pos
    for i, phase in enumerate(spec.phases):
        key = f"phases[{i}]"
        if not previous < phase.at < spec.trainer.max_steps:
            raise ConfigError(
                f"{key}.at={phase.at} must lie after the previous phase's ({previous}) and before "
                f"trainer.max_steps={spec.trainer.max_steps}, in increasing order"
            )
        if phase.pos is not None:
            scheme = _phase_scheme(phase.pos, f"{key}.pos={phase.pos_entry}", model)
        if phase.scaling is not None and phase.scaling not in scheme.length_scalings:
            raise ConfigError(
                f"{key}.scaling={phase.scaling}: the scheme in force then has no such length scaling "
                f"(its scalings: {', '.join(scheme.length_scalings) or 'none'})"
            )
        if phase.seq_len is not None:
            _check_seq_len(phase.seq_len, task, spec.data, key)
        build = None if phase.pos is None else phase.pos.factory()
        phases.append(Phase(phase.at, phase.label, build, phase.scaling, phase.factor, phase.seq_len))
        previous = phase.at
    return tuple(phases)


def _phase_scheme(pos: Component, what: str, model: Transformer) -> PositionalScheme:
    """A phase's scheme (``what``: ``phases[0].pos=none``), built on meta, paired with every layer's variant."""
    with torch.device("meta"):
        scheme = pos.build(model.pos.shape)
    try:
        check_layers(scheme, model.variants)
    except IncompatiblePairing as e:
        raise IncompatiblePairing(f"{what}: {e}") from None
    _check_trainable(scheme, what)
    return scheme


def _check_seq_len(seq_len: int, task: Task, data: DataSettings, key: str) -> None:
    if task.scores_sequences:
        raise ConfigError(
            f"{key}.seq_len: this task's examples are whole sequences, not windows to cut; "
            "phases change the training length of text tasks (mlm, clm)"
        )
    if not 2 <= seq_len <= data.seq_len:
        raise ConfigError(
            f"{key}.seq_len={seq_len} must lie in 2 … data.seq_len={data.seq_len}: the "
            "windows are data.seq_len long and a phase trains on their first seq_len tokens"
        )


def _check_trainable(scheme: PositionalScheme, what: str) -> None:
    if any(True for _ in scheme.parameters()):
        raise ConfigError(
            f"{what} has trained parameters; a phase switches between schemes without any (rope, "
            "none, alibi, sinusoidal, …), so no weights are lost or start untrained at a boundary"
        )


def final_model(phases: tuple[Phase, ...], model: Transformer) -> Transformer:
    """``model`` with the scheme in force when training ends (the final evaluation's), built on meta; the same
    model when nothing is phased."""
    if not phases:
        return model
    from harness.model.phases import state_at

    state = state_at(list(phases), 10**18)
    build = phases[state.pos_from].pos if state.pos_from >= 0 else None
    if build is None:
        return model
    ended = copy.copy(model)  # a shallow copy: the same modules, only its scheme replaced
    ended._modules = dict(model._modules)
    with torch.device("meta"):
        ended._modules["pos"] = build(model.pos.shape)
    return ended
