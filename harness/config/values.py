"""Values rules: a resolved config typed into a ``RunSpec``, every value checked where it was written.

The rule, for every node:
- a node with ``_target_`` is a ``Component``, typed by the signature of what it builds: each key must be a parameter
  of that callable and its value must fit the parameter's annotation (``pos=rope`` → ``Rope.__init__``,
  ``optim.optimizer`` → ``torch.optim.AdamW``), ranges included (``Annotated``, harness/ranges.py);
- a node without one is typed by its settings dataclass (harness/config/spec.py).
Nested values are checked with their own path: ``pos.layers[2].base``, ``phases[0].factor``, ``phases[0].pos.base``.
Unknown keys are refused with the nearest known one. Nothing here imports torch or Lightning.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from harness.config.catalog import check_interface, locate
from harness.config.spec import (
    BudgetSettings,
    CheckpointSettings,
    Component,
    DataSettings,
    EvalSettings,
    Json,
    LoggerSettings,
    ProgressSettings,
    ReportSettings,
    TrainerSettings,
)
from harness.errors import ConfigError
from harness.extras import check_requires
from harness.paths import CONF
from harness.ranges import check_magnitude, check_value, field_hints

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
OptionNode = Callable[[str, str, str], Json]  # (group, name, key) -> conf/<group>/<name>.yaml as a plain node


def node_of(values: Json, key: str) -> Json:
    node = values.get(key)
    return node if isinstance(node, dict) else {}


def name_of(values: Json, group: str) -> str:
    target = node_of(values, group).get("_target_")
    return str(target).rsplit(".", 1)[-1].lower() if target else group


def chosen(group: str, node: Json) -> bool:
    """Whether ``node`` is an option of ``group``, not only the keys conf/config.yaml gives every pos node."""
    from positional.randomized import KEYS

    return group != "pos" or bool(set(node) - set(KEYS))


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
        check_known("trainer", unknown, [*fields, *trainer_arguments()], "trainer")
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


def trainer_arguments() -> list[str]:
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
