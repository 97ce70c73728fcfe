"""``phases``: the config's list of positional phases, checked and turned into ``Phase`` objects (harness/model/
phases.py says what a phase does) before anything is built.

    phases=[{at: 300, pos: none}]                                   DroPE: RoPE for 300 steps, then none
    phases=[{at: 200, pos: 'rope(base=500000)', seq_len: 128}]     ABF: a larger base with the longer length
    phases=[{at: 100, scaling: yarn, factor: 2}]                   YaRN in training from step 100

A phase's ``pos`` is an option name or an entry with settings of its own, as in pos.layers: the run's own option
builds from the run's pos node (its settings carry over), another from its conf/pos YAML. Each phase's scheme is
built dry against the model (its pairing with every layer's attention variant, its scalings), and a scheme with
trained parameters is refused on either side of a boundary: its weights would be lost or start untrained, and
the checkpoints of one run would hold different keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from harness.errors import ConfigError, IncompatiblePairing

KEYS = ("at", "pos", "scaling", "factor", "seq_len")
EXAMPLE = "phases=[{at: 300, pos: none}]"


@dataclass(frozen=True)
class PhaseSettings:
    """One entry of ``phases``, typed; ranges against the run are checked in ``checked_phases``."""

    at: int
    pos: str | None = None
    scaling: str | None = None
    factor: float | None = None
    seq_len: int | None = None


def parse(raw, index: int) -> PhaseSettings:
    key = f"phases[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}={raw!r} must be a mapping such as {{at: 300, pos: none}}; e.g. {EXAMPLE}")
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]} is no phase key; use {', '.join(KEYS)}")
    checks = {"at": int, "seq_len": int, "pos": str, "scaling": str}
    for name, kind in checks.items():
        value = raw.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ConfigError(f"{key}.{name}={value!r} must be {'an integer' if kind is int else 'a name'}")
    factor = raw.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1):
        raise ConfigError(f"{key}.factor={factor!r} must be a number > 1 (the lengths the scaling extends to, over "
                          "the training length)")
    if "at" not in raw:
        raise ConfigError(f"{key} has no 'at': the optimizer step it begins at, e.g. {EXAMPLE}")
    if not any(raw.get(k) is not None for k in ("pos", "scaling", "seq_len")):
        raise ConfigError(f"{key} changes nothing; give it pos, scaling (with factor) or seq_len")
    if (raw.get("scaling") is None) != (factor is None):
        raise ConfigError(f"{key}: scaling and factor go together, e.g. {{at: 100, scaling: yarn, factor: 2}}")
    return PhaseSettings(**{k: raw.get(k) for k in KEYS if k in raw})


def checked_phases(cfg, model, task, data, max_steps: int) -> list:
    """The ``Phase`` list of a config, each phase's scheme built dry on the meta device against ``model``."""
    from harness.config.catalog import locate, option_name
    from harness.config.layers import has_pattern
    from harness.model.phases import Phase

    raw = cfg.get("phases")
    raw = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw or []
    if not isinstance(raw, list):
        raise ConfigError(f"phases={raw!r} must be a list, e.g. {EXAMPLE}")
    settings = [parse(r, i) for i, r in enumerate(raw)]
    if not settings:
        return []
    if has_pattern(cfg.pos):
        raise ConfigError("phases change the run's one scheme; pos.layers (a per-layer pattern) has no phases yet: "
                          "drop one of them")
    _check_trainable(model.pos, f"pos={option_name(type(model.pos))}, the run's own scheme")
    own = option_name(locate("pos._target_", cfg.pos._target_))
    phases, previous, scheme = [], 0, model.pos
    for i, s in enumerate(settings):
        key = f"phases[{i}]"
        if not previous < s.at < max_steps:
            raise ConfigError(f"{key}.at={s.at} must lie after the previous phase's ({previous}) and before "
                              f"trainer.max_steps={max_steps}, in increasing order")
        build = None
        if s.pos is not None:
            build, scheme = _phase_scheme(cfg, model, own, s.pos, key)
        if s.scaling is not None and s.scaling not in scheme.length_scalings:
            has = ", ".join(scheme.length_scalings) or "none"
            raise ConfigError(f"{key}.scaling={s.scaling}: the scheme in force then has no such length scaling "
                              f"(its scalings: {has})")
        if s.seq_len is not None:
            _check_seq_len(s.seq_len, task, data, key)
        label = " ".join(f"{k}={v}" for k, v in (("pos", s.pos), ("scaling", s.scaling), ("factor", s.factor),
                                                 ("seq_len", s.seq_len)) if v is not None)
        phases.append(Phase(s.at, label, build, s.scaling, s.factor, s.seq_len))
        previous = s.at
    return phases


def _phase_scheme(cfg, model, own: str, entry: str, key: str):
    """A phase's ``pos`` (an option name, with settings: ``alibi`` or ``rope(base=500)``): its factory, and the
    scheme built dry on meta, checked against the run's variants and for trained parameters."""
    import torch

    from harness.config.instantiate import instantiate_option
    from harness.config.layers import option_node
    from harness.model.layers import check_layers, parse_entry

    name, extra = parse_entry(entry, f"{key}.pos")
    base = cfg.pos if name == own else option_node("pos", name, f"{key}.pos")
    unknown = [k for k in extra if k.startswith("_") or k not in base]
    if unknown:
        raise ConfigError(f"{key}.pos: {entry} sets {unknown[0]}, which is not a key of pos={name}")
    build = instantiate_option(OmegaConf.merge(base, extra) if extra else base, "pos")
    with torch.device("meta"):
        scheme = build(model.pos.shape)
    try:
        check_layers(scheme, model.variants)
    except IncompatiblePairing as e:
        raise IncompatiblePairing(f"{key}.pos={entry}: {e}") from None
    _check_trainable(scheme, f"{key}.pos={entry}")
    return build, scheme


def _check_seq_len(seq_len: int, task, data, key: str) -> None:
    if task.scores_sequences:
        raise ConfigError(f"{key}.seq_len: this task's examples are whole sequences, not windows to cut; "
                          "phases change the training length of text tasks (mlm, clm)")
    if not 2 <= seq_len <= data.seq_len:
        raise ConfigError(f"{key}.seq_len={seq_len} must lie in 2 … data.seq_len={data.seq_len}: the "
                          "windows are data.seq_len long and a phase trains on their first seq_len tokens")


def final_scheme(phases: list, model):
    """The scheme in force when training ends (the final evaluation's), built dry."""
    import torch

    from harness.model.phases import state_at

    state = state_at(phases, 10**18)
    if state.pos_from < 0:
        return model.pos
    with torch.device("meta"):
        return phases[state.pos_from].pos(model.pos.shape)


def final_model(phases: list, model):
    """``model`` with the scheme it ends training with (built dry; the same model when nothing is phased)."""
    scheme = final_scheme(phases, model)
    if scheme is model.pos:
        return model
    import copy

    ended = copy.copy(model)  # a shallow copy: the same modules, only its scheme replaced
    ended._modules = dict(model._modules)
    ended._modules["pos"] = scheme
    return ended


def _check_trainable(scheme, what: str) -> None:
    if any(True for _ in scheme.parameters()):
        raise ConfigError(f"{what} has trained parameters; a phase switches between schemes without any (rope, "
                          "none, alibi, sinusoidal, …), so no weights are lost or start untrained at a boundary")
