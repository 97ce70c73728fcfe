"""Options named by entry: the run's ``pos`` and ``attn`` with a per-layer pattern (``pos.layers``), and the schemes of
positional ``phases``.

An entry is an option's name, or a name with settings of its own, ``rope(base=1000000)`` (Gemma 3's global
layers): the run's own option builds from the run's node (its settings carry over), another from its conf/ YAML,
and either is typed as a component of its own, with its own path: ``pos.layers[2]``, ``phases[0].pos``, so a bad
value is named where it was typed (``pos.layers[2].base=0 …``).
"""

from __future__ import annotations

import re

from harness.config.spec import Choice, Component, Json, PhaseSpec, Randomize
from harness.config.values import OptionNode, component, settings
from harness.errors import ConfigError
from positional.randomized import KEYS as RANDOMIZE  # the pos keys of the wrapper any scheme takes

LAYERS = "layers"  # pos.layers / attn.layers: a per-layer pattern
PATTERN_EXAMPLES = {"pos": "[rope,rope,rope,none]", "attn": "[local,local,local,local,local,softmax]"}
PHASE_KEYS = ("at", "pos", "scaling", "factor", "seq_len")
PHASE_EXAMPLE = "phases=[{at: 300, pos: none}]"


def choice(group: str, node: Json, name: str, option_node: OptionNode) -> Choice:
    """The run's ``pos`` (``attn``): its option, the wrapper keys (pos), and a per-layer pattern's entries."""
    randomize = (
        settings(Randomize, group, {k: node[k] for k in RANDOMIZE if k in node}) if group == "pos" else Randomize()
    )
    own = own_node(node) if group == "pos" else {k: v for k, v in node.items() if k != LAYERS}
    option = component(group, own, f"{group}={name}", group, ("shape",))
    if node.get(LAYERS) is None:
        return Choice(name, option, randomize=randomize)
    unit = pattern_unit(node[LAYERS], group)
    entries: dict[str, Component] = {}
    names: dict[str, str] = {}
    for i, entry in enumerate(unit):
        if entry in entries:
            continue
        names[entry], entries[entry] = entry_component(
            group, entry, f"{group}.{LAYERS}[{i}]", f"{group}.{LAYERS}", (option.name, own), option_node
        )
    if option.name not in names.values():
        raise ConfigError(
            f"{group}.{LAYERS}={list(unit)} names no {option.name} layer, so the {group}={option.name} "
            f"settings would be unused; put {option.name} in the pattern, or pick "
            f"{group}=<one of its names>"
        )
    return Choice(name, option, unit, entries, randomize)


def own_node(node: Json) -> Json:
    """The pos node less the pattern and the wrapper's keys: what the chosen option's class takes."""
    return {k: v for k, v in node.items() if k != LAYERS and k not in RANDOMIZE}


def pattern_unit(value: object, group: str) -> tuple[str, ...]:
    """``pos.layers`` as a tuple of entries (option names, or ``rope(base=1000000)``): a list, or one
    comma-separated string (as a YAML file may hold it)."""
    if isinstance(value, str):
        value = split_entries(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(
            f"{group}.{LAYERS}={value!r} must be a list of {group} option names, one per layer of the "
            f"repeating unit, e.g. +{group}.{LAYERS}={PATTERN_EXAMPLES[group]}"
        )
    return tuple(value)


def entry_component(
    group: str, entry: str, key: str, listed: str, own: tuple[str, Json], option_node: OptionNode
) -> tuple[str, Component]:
    """An entry's option name and its component, typed at ``key``: the run's own option (``own``: its name and node)
    builds from the run's node, another from its conf/ YAML (named at ``listed`` if it is none); the entry's own
    settings (``rope(base=1e6)``) are each a key the option has."""
    name, extra = parse_entry(entry, key)
    base = own[1] if name == own[0] else option_node(group, name, listed)
    unknown = [k for k in extra if k.startswith("_") or k not in base]
    if unknown:
        keys = ", ".join(k for k in base if not k.startswith("_"))
        raise ConfigError(f"{key}.{unknown[0]} is not a key of {group}={name}; use some of {keys}")
    return name, component(key, {**base, **extra}, f"{group}={name}", group, ("shape",))


ENTRY = re.compile(r"([A-Za-z_][\w-]*)(?:\(([^()]*)\))?")


def parse_entry(entry: str, key: str) -> tuple[str, dict[str, object]]:
    """One entry: an option name, or a name with settings of its own, ``rope(base=1000000)`` (Gemma's global
    layers: θ = 1M where the local ones keep 10k). Returns (name, settings)."""
    match = ENTRY.fullmatch(entry.strip())
    pairs = [p.partition("=") for p in split_entries(match.group(2))] if match and match.group(2) else []
    if not match or any(not k.strip() or not eq or not v.strip() for k, eq, v in pairs):
        raise ConfigError(
            f"{key}={entry!r} is no entry; write an option name, or one with settings of its own, "
            "e.g. rope(base=1000000)"
        )
    settings_: dict[str, object] = {}
    for k, _, v in pairs:
        if k.strip() in settings_:
            raise ConfigError(f"{key}={entry!r} sets {k.strip()} twice; give each setting once")
        settings_[k.strip()] = _scalar(v.strip())
    return match.group(1), settings_


def split_entries(text: str) -> list[str]:
    """``a,b(x=1,y=2),c`` -> [a, b(x=1,y=2), c]: commas inside parentheses belong to their entry."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def _scalar(text: str) -> object:
    """A setting's value as the config would read it: an int, a float, true/false/null, or the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text.lower(), text.strip("'\""))


# ---------------------------------------------------------------- phases


def phases(raw: object, pos: Choice, own: Json, option_node: OptionNode) -> tuple[PhaseSpec, ...]:
    """``phases``: each entry typed, its ``pos`` a component of its own (``phases[0].pos``)."""
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"phases={raw!r} must be a list, e.g. {PHASE_EXAMPLE}")
    if pos.pattern:
        raise ConfigError(
            "phases change the run's one scheme; pos.layers (a per-layer pattern) has no phases yet: drop one of them"
        )
    return tuple(_phase(entry, i, pos.option.name, own, option_node) for i, entry in enumerate(raw))


def _phase(raw: object, index: int, own_name: str, own: Json, option_node: OptionNode) -> PhaseSpec:
    key = f"phases[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}={raw!r} must be a mapping such as {{at: 300, pos: none}}; e.g. {PHASE_EXAMPLE}")
    unknown = [k for k in raw if k not in PHASE_KEYS]
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]} is no phase key; use {', '.join(PHASE_KEYS)}")
    if "at" not in raw:
        raise ConfigError(f"{key} has no 'at': the optimizer step it begins at, e.g. {PHASE_EXAMPLE}")
    if not any(raw.get(k) is not None for k in ("pos", "scaling", "seq_len")):
        raise ConfigError(f"{key} changes nothing; give it pos, scaling (with factor) or seq_len")
    if (raw.get("scaling") is None) != (raw.get("factor") is None):
        raise ConfigError(f"{key}: scaling and factor go together, e.g. {{at: 100, scaling: yarn, factor: 2}}")
    entry, scheme = raw.get("pos"), None
    if entry is not None and not isinstance(entry, str):
        raise ConfigError(
            f"{key}.pos={entry!r} must be an option's name, or one with settings of its own, e.g. "
            f"none or 'rope(base=500000)'"
        )
    if isinstance(entry, str):
        _, scheme = entry_component("pos", entry, f"{key}.pos", f"{key}.pos", (own_name, own), option_node)
    return settings(PhaseSpec, key, {**raw, "key": key, "pos": scheme, "pos_entry": entry})
