"""What can be chosen: every option of the pos, attn and task groups, read from the config search path.

An option is a YAML file ``<group>/<name>.yaml`` whose ``_target_`` names a class. The search path is
the project's ``conf/`` followed by the user's own config directories (Hydra's ``--config-dir DIR`` or
``hydra.searchpath=[DIR]``), so a scheme in the user's own package, named by a YAML of their own,
is listed, paired and reported like a built-in. A class can also be named directly on the command line
(``pos._target_=mypkg.MyScheme``): ``retarget`` then names the cell after the class, not after the
option it replaced, and keeps from that option only the keys the new class takes.

Nothing here is a list of options: every name comes from a file or a class.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.errors import ConfigError, one_line
from harness.markdown import table
from harness.paths import CONF

GROUPS = ("pos", "attn", "task")  # the groups whose options are classes a user adds
# What a class named by each group must be: (module, class, words)
INTERFACES = {
    "pos": ("positional.base", "PositionalScheme", "a positional scheme"),
    "attn": ("attention.base", "AttentionVariant", "an attention variant"),
    "task": ("harness.data.objectives", "Task", "a task"),
}
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")


def locate(key: str, target: str) -> type:
    """The class a ``_target_`` names; a one-line ConfigError if it does not import."""
    import logging

    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")  # it logs the failure over several lines, then raises it
    level, hydra_log.disabled = hydra_log.disabled, True
    try:
        return get_object(target)
    except Exception as e:
        raise ConfigError(
            f"{key}={target!r} cannot be imported ({one_line(e.__cause__ or e)}); name a class importable here, e.g. "
            "positional.rope.Rope, or mypkg.MyScheme with mypkg on PYTHONPATH"
        ) from None
    finally:
        hydra_log.disabled = level


def check_catalogue_args(flag: str, argv: list[str]) -> str:
    """``--matrix`` and ``--list`` read the options of conf/ and of the ``--config-dir`` / ``hydra.searchpath``
    dirs, and ``<group>._target_=`` classes: any other argument would be ignored, so it is refused. Returns the
    format the flag asks for: text, or md (``--list=md``)."""
    name, _, fmt = flag.partition("=")
    if (fmt or "text") not in ("text", "md"):
        raise ConfigError(f"unknown {name.lstrip('-')} format {fmt!r}; use {name} or {name}=md")
    valued = {i + 1 for i, a in enumerate(argv) if a in CONFIG_DIR_FLAGS}  # --config-dir DIR's DIR
    matrix = name == "--matrix"
    settable = ("hydra.searchpath", *(("pos.layers", "attn.layers") if matrix else ()))  # a pattern's row (column)
    targets = {f"{g}._target_" for g in GROUPS}
    patterns = ", pos.layers=[...], attn.layers=[...]" if matrix else ""
    for i, arg in enumerate(argv):
        key = arg.partition("=")[0]
        if i in valued or key in CONFIG_DIR_FLAGS or key.lstrip("+") in settable or key.lstrip("+~") in targets:
            continue
        raise ConfigError(
            f"{name} lists every option and takes no setting but --config-dir DIR, "
            f"hydra.searchpath=[...] and {', '.join(f'{g}._target_=CLASS' for g in GROUPS)}{patterns}; "
            f"drop {arg}"
        )
    return fmt or "text"


def options(group: str, extra: Sequence[str | Path] = (), need_target: bool = True) -> dict[str, dict]:
    """Every option of ``group`` on the search path (conf/, then the user's config directories), by name, in name
    order, as its YAML node is written (its own keys; ``defaults`` not merged); ``need_target``: only those that name
    a class, as a pos, attn or task option must."""
    import yaml

    found: dict[str, dict] = {}
    for root in [CONF, *(Path(d).expanduser().absolute() for d in extra)]:  # the first one wins a name
        for path in sorted((root / group).glob("*.yaml")):
            node = yaml.safe_load(path.read_text()) or {}
            node = node if isinstance(node, dict) else {}
            if path.stem not in found and (node.get("_target_") or not need_target):
                found[path.stem] = node
    return dict(sorted(found.items()))


def option_classes(group: str, extra: Sequence[str | Path] = (), target: str | None = None) -> dict[str, type]:
    """conf/<group>/<name>.yaml -> the class its ``_target_`` names, by option name; ``target``: a class named on the
    command line (``pos._target_=mypkg.MyScheme``), checked against the group's interface and added last."""
    found = {name: locate(f"{group}._target_", str(node["_target_"])) for name, node in options(group, extra).items()}
    if target:
        cls = locate(f"{group}._target_", target)
        check_interface(group, cls, target)
        found[option_name(cls)] = cls
    return found


def user_config_dirs(argv: list[str]) -> list[str]:
    """The config directories a command line adds: ``--config-dir DIR``, ``-cd DIR``, ``--config-dir=DIR``
    and ``hydra.searchpath=[file://DIR,...]`` (directories only: ``pkg://`` entries are not globbed)."""
    dirs: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            dirs += [value] if value else []
        elif flag.lstrip("+") == "hydra.searchpath":
            dirs += [
                p.strip().strip("'\"").removeprefix("file://")
                for p in value.strip("[]").split(",")
                if p.strip() and not p.strip().strip("'\"").startswith("pkg://")
            ]
    missing = [d for d in dirs if not Path(d).expanduser().is_dir()]
    # as a run refuses it (harness/config/hydra_errors.py user_error): --list must not list without the user's options
    if missing:
        raise ConfigError(
            f"Additional config directory '{missing[0]}' not found; --config-dir (-cd) takes an "
            "existing folder of YAML configs (CONTRIBUTING.md, 'From your own package')"
        )
    return dirs


def option_node(group: str, name: str, key: str, extra: Sequence[str | Path] = ()) -> dict:
    """conf/<group>/<name>.yaml as a plain node, its same-group ``defaults`` (rope_trainable's ``rope``) merged under
    it; a sub-group default (rope's ``scaling: none``) sets nothing: the option's own keys hold its values. ``key``:
    where the name was written, for the refusal of a name that is no option."""
    found = options(group, extra)
    if name not in found:
        raise ConfigError(
            f"{key} names {name!r}, which is no {group} option; use names of conf/{group}/: {', '.join(found)}"
        )
    node = dict(found[name])
    defaults = node.pop("defaults", None) or []
    parents = [option_node(group, p, key, extra) for p in defaults if isinstance(p, str) and p != "_self_"]
    return {k: v for each in [*parents, node] for k, v in each.items()}  # a later one's value wins


# ---------------------------------------------------------------- where a key lives (for a refusal's fix)


def options_with_key(key: str) -> list[str]:
    """The options of ``key``'s group that define the rest of ``key`` (``data.path`` → ``data=enwik8``,
    ``data=text``; ``pos.scaling.alpha`` → ``pos/scaling=yarn``): the user picked an option without it."""
    parts = key.split(".")
    at = next((i for i in range(len(parts) - 1, 0, -1) if (CONF / "/".join(parts[:i])).is_dir()), None)
    if at is None:
        return []
    group, rest = "/".join(parts[:at]), parts[at:]

    def defines(node: object, parts: list[str]) -> bool:
        return not parts or (isinstance(node, dict) and parts[0] in node and defines(node[parts[0]], parts[1:]))

    return [f"{group}={name}" for name, node in options(group, need_target=False).items() if defines(node, rest)]


def nested_options_with_key(key: str) -> list[str]:
    """The options of a group nested in ``key``'s group that define ``key``'s last part (``pos.factor`` →
    ``pos/scaling=linear``, …): the key moved into a node of its own."""
    head, _, rest = key.partition(".")
    if not rest or "." in rest or not (CONF / head).is_dir():
        return []
    return [
        f"{head}/{sub.name}={name}"
        for sub in sorted(p for p in (CONF / head).iterdir() if p.is_dir())
        for name, node in options(f"{head}/{sub.name}", need_target=False).items()
        if rest in node
    ]


def groups_listing(group: str) -> list[str]:
    """The options of ``group``'s parent whose defaults list hold the nested ``group`` (``pos/scaling`` →
    ``pos=rope``, ``pos=rope_trainable``), directly or through an option they extend."""
    parent, _, sub = group.rpartition("/")
    found = options(parent, need_target=False)

    def holds(name: str, seen: frozenset = frozenset()) -> bool:
        if name in seen or name not in found:
            return False
        return any(
            (isinstance(d, dict) and sub in d) or (isinstance(d, str) and holds(d, seen | {name}))
            for d in found[name].get("defaults", [])
        )

    return [f"{parent}={name}" for name in found if holds(name)]


def group_names() -> list[str]:
    return sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")


# ---------------------------------------------------------------- a class named on the command line


def target_overrides(overrides: list[str]) -> dict[str, str]:
    """``{group: class path}`` for each ``<group>._target_=...`` among ``overrides``."""
    found = {}
    for override in overrides:
        key, _, value = override.partition("=")
        group, _, rest = key.lstrip("+~").partition(".")
        if rest == "_target_" and group in GROUPS and value:
            found[group] = value
    return found


def check_interface(group: str, cls: object, target: str) -> None:
    """A class named for ``group`` implements its interface (``attn._target_=builtins.dict`` does not)."""
    import importlib

    module, name, words = INTERFACES[group]
    interface = getattr(importlib.import_module(module), name)
    try:
        fits = isinstance(cls, type) and issubclass(cls, interface)
    except TypeError:  # a Protocol with data members: issubclass cannot tell; its methods are checked on use
        fits = isinstance(cls, type)
    if not fits:
        raise ConfigError(
            f"{group}._target_={target} is not {words}: {group} builds a subclass of {module}.{name}; "
            f"name one (CONTRIBUTING.md shows how to write one)"
        )


def option_name(cls: Callable) -> str:
    """A class's option name: its own ``config_name()`` (schemes and variants: the module's last part)."""
    name = getattr(cls, "config_name", None)
    return str(name()) if callable(name) else cls.__module__.rsplit(".", 1)[-1]


# ---------------------------------------------------------------- python run.py --list


def _summary_line(cls: type, group: str) -> str:
    """The first line of the docstring that says what the option is: a scheme or variant file opens with its
    paper (the module's docstring), a task class says what it asks (the class's own)."""
    import sys

    module, own = inspect.getdoc(sys.modules[cls.__module__]), cls.__dict__.get("__doc__")
    doc = (inspect.cleandoc(own) if group == "task" and own else module) or inspect.getdoc(cls) or ""
    first = one_line(doc.strip().split("\n\n")[0])  # the first paragraph, on one line
    return first if len(first) <= 110 else first[:109].rsplit(" ", 1)[0] + " …"


def describe(group: str, cls: type) -> str:
    """What the harness reads from a class's declarations: hooks and bias kind, or the biases it accepts."""
    from attention.base import AttentionVariant
    from positional.base import PositionalScheme

    if issubclass(cls, PositionalScheme):
        hooks = sorted(cls.hooks()) or ["none"]
        wide = "; rotary widens q, k" if getattr(cls, "rotary_widens", False) else ""
        return f"hooks: {', '.join(hooks)}; bias: {cls.bias_kind}{wide}"
    if issubclass(cls, AttentionVariant):
        wide = "" if getattr(cls, "wide_rotary_refusal", "") else "; takes widened q, k"
        return f"accepts bias: {', '.join(sorted(cls.accepts_bias)) or 'none'}{wide}"
    return ""


def render_catalogue(
    extra: Sequence[str | Path] = (), markdown: bool = False, targets: dict[str, str] | None = None
) -> str:
    """Every option of each group, and each class ``targets`` names for a group (``pos._target_=pkg.Class``),
    listed under the name a run gives its cell (``option_name``)."""
    lines = []
    targets = targets or {}
    for group in GROUPS:
        found = dict(sorted(option_classes(group, extra, targets.get(group)).items()))
        lines += [f"## {group}=" if markdown else f"{group}= ({len(found)} options)", ""]
        rows = [(name, _summary_line(cls, group), describe(group, cls)) for name, cls in found.items()]
        if markdown:
            lines += table(
                ["option", "what", "declares"], [[f"`{name}`", what, declares] for name, what, declares in rows]
            )
        else:
            lines += [
                f"  {name:<20} {what}" + (f"\n  {'':<20} [{declares}]" if declares else "")
                for name, what, declares in rows
            ]
        if group == "pos":  # a wrapper any of them takes, not an option of its own (positional/randomized.py)
            refusing = ", ".join(n for n, c in found.items() if getattr(c, "randomize_refusal", None))
            said = [
                "any pos takes pos.randomize=true pos.max_position=N: each forward's positions drawn from [0, N)",
                f"(Ruoss et al. 2023), except {refusing}, which refuse it with their reason",
            ]
            lines += ["", " ".join(said)] if markdown else [f"  {line}" for line in said]
        lines.append("")
    return "\n".join(lines)


def print_catalogue(flag: str, argv: list[str]) -> int:
    """``--list`` (text) or ``--list=md``; returns the exit status."""
    fmt = check_catalogue_args(flag, argv)
    print(render_catalogue(user_config_dirs(argv), markdown=fmt == "md", targets=target_overrides(argv)), end="")
    return 0
