"""Values rules: a resolved config typed into a ``RunSpec``, every value checked where it was written.

The rule, for every node:
- a node with ``_target_`` is a ``Component``, typed by the signature of what it builds: each key must be a parameter
  of that callable and its value must fit the parameter's annotation (``pos=rope`` → ``Rope.__init__``,
  ``optim.optimizer`` → ``torch.optim.AdamW``), ranges included (``Annotated``, harness/ranges.py);
- a node without one is typed by its settings dataclass (harness/config/spec.py).
Nested values are checked with their own path: ``pos.layers[2].base``, ``phases[0].factor``, ``phases[0].pos.base``.
Unknown keys are refused with the nearest known one. Nothing here imports Lightning.

Options named by entry: the run's ``pos`` and ``attn`` with a per-layer pattern (``pos.layers``), and the schemes of
positional ``phases``. An entry is an option's name, or a name with settings of its own, ``rope(base=1000000)``
(Gemma 3's global layers): the run's own option builds from the run's node (its settings carry over), another from
its conf/ YAML, and either is typed as a component of its own, with its own path: ``pos.layers[2]``,
``phases[0].pos``, so a bad value is named where it was typed (``pos.layers[2].base=0 …``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness.config.catalog import check_interface, locate, option_node
from harness.config.spec import (
    BudgetSettings,
    CheckpointSettings,
    Choice,
    Component,
    DataSettings,
    EvalSettings,
    Json,
    LoggerSettings,
    PhaseSpec,
    ProgressSettings,
    Randomize,
    ReportSettings,
    TrainerSettings,
)
from harness.errors import ConfigError
from harness.extras import check_requires
from harness.paths import CONF
from harness.ranges import check_magnitude, check_value, field_hints
from positional.randomized import KEYS as RANDOMIZE  # the pos keys of the wrapper any scheme takes

GROUPS = ("pos", "attn", "model", "data", "tokenizer", "task", "optim", "trainer", "logger")
PLAIN: dict[str, type] = {  # the settings nodes, in the order they are checked (RunSpec's fields of the same names)
    "data": DataSettings,
    "eval": EvalSettings,
    "report": ReportSettings,
    "logger": LoggerSettings,
    "progress": ProgressSettings,
    "budget": BudgetSettings,
    "checkpoint": CheckpointSettings,
}
# Parameters of a ``_target_`` the harness passes itself, by node.
SUPPLIED = {"scaling": ("base", "rotated")}  # pos.scaling: Rope completes it with the θ it scales
# top-level keys posbench once took, and where each went: an old command gets the new spelling, not a list of keys
MOVED = {
    "arm": "a preset's arms are in its folder now (conf/experiment/<preset>/arm/): +arm=<preset>/<arm> is "
    "+experiment/<preset>/arm=<arm>"
}
S = TypeVar("S")


def node_of(values: Json, key: str) -> Json:
    node = values.get(key)
    return node if isinstance(node, dict) else {}


def name_of(values: Json, group: str) -> str:
    target = node_of(values, group).get("_target_")
    return str(target).rsplit(".", 1)[-1].lower() if target else group


def chosen(group: str, node: Json) -> bool:
    """Whether ``node`` is an option of ``group``, not only the keys conf/config.yaml gives every pos node."""
    return group != "pos" or bool(set(node) - set(RANDOMIZE))


def missing_group(group: str) -> str:
    """The line for a run without one of the groups it needs (``~pos``, ``pos=null``, a preset that drops one)."""
    return (
        f"the config has no {group} (a run needs every group: {', '.join(GROUPS)}); "
        f"pick one with {group}=NAME (python run.py --list lists them)"
        f"{', e.g. pos=none for no positions' if group == 'pos' else ''}"
    )


def check_known(node: str, keys: list[str], known: list[str], what: str) -> None:
    """Every key of ``node`` ("" for the top level) is one ``known`` to its schema; else name the nearest."""
    known = list(dict.fromkeys(known))
    for key in keys:
        if key in known or key.startswith("_"):
            continue
        full = f"{node}.{key}" if node else key
        prefixed = [k for k in known if k.startswith(key)]  # a name cut short (report.target): its whole name
        near = prefixed[:1] if len(prefixed) == 1 else difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = MOVED.get(full) or (
            f"did you mean {f'{node}.' if node else ''}{near[0]}?"
            if near
            else f"{what} takes {', '.join(sorted(known))}"
        )
        raise ConfigError(f"{full} is not a setting of {what}; {hint}")


def settings(cls: type[S], key: str, node: Json, what: str = "") -> S:
    """A settings dataclass from its node: unknown keys refused, then its own ``__post_init__`` (types, ranges)."""
    check_known(key, list(node), list(field_hints(cls)), what or key)
    return cls(**node)  # untyped values in: the dataclass's ``__post_init__`` types them (``check_fields``)


# ---------------------------------------------------------------- components: typed by their signature


def component(
    key: str, node: Json, what: str, interface: str | None = None, supplied: tuple[str, ...] = ()
) -> Component:
    """The node's ``_target_`` and keyword arguments, each value checked against the target's signature (less
    ``supplied``, the arguments the harness passes itself); ``interface``: the group whose base class it must be."""
    if "_target_" not in node:
        raise ConfigError(f"{key} has no _target_ (the class it builds); pick an option with {key}=NAME")
    target = locate(f"{key}._target_", str(node["_target_"]))
    check_requires(str(node["_target_"]), key)  # a class's declared packages (harness/extras.py), before it is built
    if interface:
        check_interface(interface, target, str(node["_target_"]))
    fields, open_kwargs = signature_schema(target, supplied)
    keys = [k for k in node if not k.startswith("_")]
    if not open_kwargs:
        check_known(key, keys, list(fields), what)
    kwargs: dict[str, object] = {}
    for name in keys:
        value = node[name]
        if isinstance(value, dict) and "_target_" in value:  # an object handed in (pos.scaling): its own keys
            value = component(f"{key}.{name}", value, f"{key}.{name}", supplied=SUPPLIED.get(name, ()))
        else:
            try:
                check_value(f"{key}.{name}", value, fields.get(name, Any))
                check_magnitude(f"{key}.{name}", value, fields.get(name, Any))
            except ConfigError as e:
                raise ConfigError(f"{e}{_nested_group_hint(key, name)}") from None
        kwargs[name] = value
    return Component(key, target, kwargs)


def signature_schema(target: Any, supplied: tuple[str, ...] = ()) -> tuple[dict[str, Any], bool]:
    """(parameter name -> annotation, accepts **kwargs) of what a ``_target_`` builds, minus the parameters the
    harness supplies itself (``shape``, ``tokenizer``, ``params`` …)."""
    # through @ranged: a class's own __init__ is what its node's keys go to (mypy calls reading a class's __init__
    # unsound, since a subclass may differ: that class's own is the one wanted)
    fn = inspect.unwrap(getattr(target, "__init__") if isinstance(target, type) else target)  # noqa: B009
    params = inspect.signature(fn).parameters
    try:
        hints = typing.get_type_hints(fn, include_extras=True)  # Annotated ranges kept
    except Exception:  # annotations that do not evaluate here: check names only
        hints = {}
    schema = {
        n: hints.get(n, p.annotation if isinstance(p.annotation, type) else Any)
        for n, p in params.items()
        if n not in ("self", *supplied) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return schema, any(p.kind is p.VAR_KEYWORD for p in params.values())


def _nested_group_hint(path: str, key: str) -> str:
    """Where ``path.key`` is a config group of its own (pos.scaling: conf/pos/scaling/), how to pick one."""
    names = sorted(p.stem for p in (CONF / path / key).glob("*.yaml")) if path in ("pos", "attn", "task") else []
    return f"; pick one with {path}/{key}=<name>: {', '.join(names)}" if names else ""


# An optimizer's step computes in the parameters' float32 (largest 3.4e38) and scales lr on the way (Adam's first
# step divides it by 1 − β₁ = 0.1): beyond this, torch stops at the first step with an overflow, after the run began
OPTIMIZER_MAX = 1e30
_FITS = (
    f"is beyond {OPTIMIZER_MAX:.0e}: the optimizer's step computes in float32 (largest 3.4e38) and would "
    "overflow at the first step; give a smaller value"
)
OPTIMIZER_RANGES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (  # (key, rule, holds), in order
    ("lr", "must be positive, e.g. optim.optimizer.lr=1e-3", lambda v: v > 0),
    ("eps", "must be positive", lambda v: v > 0),
    ("weight_decay", "must be ≥ 0", lambda v: v >= 0),
    *((key, _FITS, lambda v: v <= OPTIMIZER_MAX) for key in ("lr", "eps", "weight_decay")),
    ("momentum", "must lie in [0, 1)", lambda v: 0 <= v < 1),
    ("betas", "must be two numbers in [0, 1), e.g. [0.9,0.98]", lambda v: all(0 <= b < 1 for b in v)),
)


def check_optimizer(optimizer: Component) -> None:
    """Ranges of the torch optimizer arguments a user is likely to set (any torch.optim class)."""
    for key, rule, ok in OPTIMIZER_RANGES:
        value = optimizer.kwargs.get(key)
        if value is not None and not ok(value):
            raise ConfigError(f"optim.optimizer.{key}={value} {rule}")


# ---------------------------------------------------------------- the trainer


def trainer_settings(node: Json) -> TrainerSettings:
    """``TrainerSettings`` from the trainer node; a key it does not type is checked by name against Lightning's
    signature (its value is Lightning's to judge) and handed on in ``extra``."""
    keys = [k for k in node if not k.startswith("_")]
    fields = {k: v for k, v in field_hints(TrainerSettings).items() if k != "extra"}
    unknown = [k for k in keys if k not in fields]
    for key in unknown:  # a typo of a known key is refused without importing Lightning (seconds)
        if difflib.get_close_matches(key, list(fields), n=1, cutoff=0.8):
            check_known("trainer", [key], list(fields), "trainer")
    if unknown:
        check_known("trainer", unknown, [*fields, *_trainer_arguments()], "trainer")
    missing = [
        f.name
        for f in dataclasses.fields(TrainerSettings)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in node
    ]
    if missing:
        raise ConfigError(
            f"trainer.{missing[0]} is missing (removed with ~trainer.{missing[0]}?), and Lightning's "
            f"default is not this harness's; set trainer.{missing[0]}=VALUE (conf/trainer/cpu.yaml "
            "has the defaults)"
        )
    return settings(
        TrainerSettings,
        "trainer",
        {**{k: node[k] for k in keys if k in fields}, "extra": {k: node[k] for k in unknown}},
    )


def _trainer_arguments() -> list[str]:
    """The parameters of ``lightning.Trainer``, read from its source: importing Lightning takes seconds, and a
    user's extra Trainer argument (``+trainer.profiler=simple``) needs only its name checked here."""
    import ast
    import importlib.util

    found = importlib.util.find_spec("lightning")  # a top-level spec: nothing is imported
    if found is None or found.origin is None:
        raise ConfigError("lightning is not installed; pip install posbench (it requires lightning)")
    source = Path(found.origin).parent / "pytorch" / "trainer" / "trainer.py"
    for tree in ast.walk(ast.parse(source.read_text())):
        if isinstance(tree, ast.ClassDef) and tree.name == "Trainer":
            init = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
            return [a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs] if a.arg not in ("logger", "callbacks")]
    raise RuntimeError(f"no Trainer.__init__ in {source}")  # a Lightning layout this harness does not know


# ---------------------------------------------------------------- options named by entry: pos.layers

PATTERN_EXAMPLES = {"pos": "[rope,rope,rope,none]", "attn": "[local,local,local,local,local,softmax]"}
PHASE_KEYS = ("at", "pos", "scaling", "factor", "seq_len")
PHASE_EXAMPLE = "phases=[{at: 300, pos: none}]"


def choice(group: str, node: Json, name: str, config_dirs: Sequence[str]) -> Choice:
    """The run's ``pos`` (``attn``): its option, the wrapper keys (pos), and a per-layer pattern's entries."""
    randomize = (
        settings(Randomize, group, {k: node[k] for k in RANDOMIZE if k in node}) if group == "pos" else Randomize()
    )
    own = own_node(node) if group == "pos" else {k: v for k, v in node.items() if k != "layers"}
    option = component(group, own, f"{group}={name}", group, ("shape",))
    if node.get("layers") is None:
        return Choice(name, option, randomize=randomize)
    unit = pattern_unit(node["layers"], group)
    typed = {  # each distinct entry once, typed where it first appears (pos.layers[2])
        entry: _entry_component(
            group, entry, f"{group}.layers[{unit.index(entry)}]", f"{group}.layers", (option.name, own), config_dirs
        )
        for entry in dict.fromkeys(unit)
    }
    if option.name not in {entry_name for entry_name, _ in typed.values()}:
        raise ConfigError(
            f"{group}.layers={list(unit)} names no {option.name} layer, so the {group}={option.name} "
            f"settings would be unused; put {option.name} in the pattern, or pick "
            f"{group}=<one of its names>"
        )
    return Choice(name, option, unit, {entry: c for entry, (_, c) in typed.items()}, randomize)


def own_node(node: Json) -> Json:
    """The pos node less the pattern and the wrapper's keys: what the chosen option's class takes."""
    return {k: v for k, v in node.items() if k != "layers" and k not in RANDOMIZE}


def pattern_unit(value: object, group: str) -> tuple[str, ...]:
    """``pos.layers`` as a tuple of entries (option names, or ``rope(base=1000000)``): a list, or one
    comma-separated string (as a YAML file may hold it)."""
    if isinstance(value, str):
        value = _split_entries(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(
            f"{group}.layers={value!r} must be a list of {group} option names, one per layer of the "
            f"repeating unit, e.g. +{group}.layers={PATTERN_EXAMPLES[group]}"
        )
    return tuple(value)


def _entry_component(
    group: str, entry: str, key: str, listed: str, own: tuple[str, Json], config_dirs: Sequence[str]
) -> tuple[str, Component]:
    """An entry's option name and its component, typed at ``key``: the run's own option (``own``: its name and node)
    builds from the run's node, another from its conf/ YAML (named at ``listed`` if it is none); the entry's own
    settings (``rope(base=1e6)``) are each a key the option has."""
    name, extra = parse_entry(entry, key)
    base = own[1] if name == own[0] else option_node(group, name, listed, config_dirs)
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
    pairs = [p.partition("=") for p in _split_entries(match.group(2))] if match and match.group(2) else []
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


def _split_entries(text: str) -> list[str]:
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


# ---------------------------------------------------------------- phases: a scheme named by entry


def phases(raw: object, pos: Choice, own: Json, config_dirs: Sequence[str]) -> tuple[PhaseSpec, ...]:
    """``phases``: each entry typed, its ``pos`` a component of its own (``phases[0].pos``)."""
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"phases={raw!r} must be a list, e.g. {PHASE_EXAMPLE}")
    if pos.pattern:
        raise ConfigError(
            "phases change the run's one scheme; pos.layers (a per-layer pattern) has no phases yet: drop one of them"
        )
    return tuple(_phase(entry, i, pos.option.name, own, config_dirs) for i, entry in enumerate(raw))


def _phase(raw: object, index: int, own_name: str, own: Json, config_dirs: Sequence[str]) -> PhaseSpec:
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
        _, scheme = _entry_component("pos", entry, f"{key}.pos", f"{key}.pos", (own_name, own), config_dirs)
    return settings(PhaseSpec, key, {**raw, "key": key, "pos": scheme, "pos_entry": entry})
