"""``pos.layers`` and ``attn.layers``: a per-layer pattern of options, from the config to a ``LayerPattern``.

``pos=rope +pos.layers=[rope,rope,rope,none]`` (a list, or one string ``rope,rope,rope,none`` in a YAML file): the
layers named like the chosen option (here rope) are built from the ``pos`` node, so ``pos.base=…`` and every other
key set on it applies to them; the other names are options of the same group (conf/pos/<name>.yaml) at their YAML's
values. An entry may carry settings of its own, ``rope(base=1e6)`` (Gemma 3's global layers), which replace that
option's keys for its layers only. The unit repeats over model.n_layers (harness/model/layers.py). The cell is
named by the pattern (``rope×3+none``), in tags, run names and reports.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.errors import ConfigError

KEY = "layers"  # the key on a pos or attn node
GROUPS = ("pos", "attn")
EXAMPLES = {"pos": "[rope,rope,rope,none]", "attn": "[local,local,local,local,local,softmax]"}


def pattern_unit(value, path: str) -> tuple[str, ...]:
    """``pos.layers`` as a tuple of entries (option names, or ``rope(base=1000000)``): a list, or a
    comma-separated string."""
    from harness.model.layers import split_entries

    if isinstance(value, str):
        value = split_entries(value)
    if isinstance(value, ListConfig):
        value = list(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{path}.{KEY}={value!r} must be a list of {path} option names, one per layer of the "
                          f"repeating unit, e.g. +{path}.{KEY}={EXAMPLES[path]}")
    return tuple(value)


def has_pattern(node) -> bool:
    return isinstance(node, (dict, DictConfig)) and node.get(KEY) is not None


def option_node(group: str, name: str, path: str) -> DictConfig:
    """conf/<group>/<name>.yaml as a node, its same-group ``defaults`` (rope_trainable's ``rope``) merged
    under it. A sub-group default (rope's ``scaling: none``) sets nothing: the option's own keys hold its
    values (pos.scaling: null)."""
    from harness.config.catalog import options

    found = options(group, user_dirs())
    check_option_name(path, name, list(found))
    node = OmegaConf.load(found[name].path)
    merged = OmegaConf.create()
    for parent in node.pop("defaults", None) or []:
        if isinstance(parent, str) and parent != "_self_":
            merged = OmegaConf.merge(merged, option_node(group, parent, path))
    return OmegaConf.merge(merged, node)


def user_dirs() -> list[str]:
    """The running job's own config directories (``--config-dir``, ``hydra.searchpath``), whose options a pattern
    may name too; none outside a Hydra job (tests, the bench: conf/ only)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [s.path for s in HydraConfig.get().runtime.config_sources if s.schema == "file" and s.provider != "main"]


def check_option_name(group: str, name: str, names: list[str]) -> None:
    if name not in names:
        raise ConfigError(f"{group}.{KEY} names {name!r}, which is no {group} option; use names of conf/{group}/: "
                          f"{', '.join(names)}")


def pattern_overrides(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """``{group: unit}`` for each ``pos.layers=[…]`` / ``+attn.layers=[…]`` among command-line ``argv``."""
    found = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        group, _, rest = key.lstrip("+").partition(".")
        if eq and group in GROUPS and rest == KEY:
            found[group] = pattern_unit(value.strip().removeprefix("[").removesuffix("]").replace("'", ""), group)
    return found


def layer_pattern(node, path: str, build):
    """The ``LayerPattern`` of a node with a ``layers`` key; ``build(node, path)`` makes one option's
    constructor (``instantiate_option``)."""
    from harness.config.catalog import locate, option_name
    from harness.model.layers import LayerPattern, parse_entry

    unit = pattern_unit(node[KEY], path)
    own_node = OmegaConf.masked_copy(node, [k for k in node if k != KEY]) if isinstance(node, DictConfig) else \
        OmegaConf.create({k: v for k, v in node.items() if k != KEY})
    own = option_name(locate(f"{path}._target_", own_node["_target_"]))
    entries = {entry: parse_entry(entry, f"{path}.{KEY}") for entry in dict.fromkeys(unit)}
    if own not in {name for name, _ in entries.values()}:
        raise ConfigError(f"{path}.{KEY}={list(unit)} names no {own} layer, so the {path}={own} settings would "
                          f"be unused; put {own} in the pattern, or pick {path}=<one of its names>")
    factories = {}
    for entry, (name, settings) in entries.items():
        base = own_node if name == own else option_node(path, name, path)
        unknown = [k for k in settings if k.startswith("_") or k not in base]
        if unknown:
            keys = ", ".join(k for k in base if not k.startswith("_"))
            raise ConfigError(f"{path}.{KEY}: {entry} sets {unknown[0]}, which is not a key of {path}={name}; "
                              f"use some of {keys}")
        factories[entry] = build(OmegaConf.merge(base, settings) if settings else base, path)
    return LayerPattern(f"{path}.{KEY}", unit, factories)


def layer_targets(node, path: str) -> dict[str, str]:
    """The class each option of a node's pattern builds (its ``_target_``), by name; {} without a pattern."""
    from harness.config.catalog import options
    from harness.model.layers import parse_entry

    if not has_pattern(node):
        return {}
    found = options(path)
    names = dict.fromkeys(parse_entry(e, f"{path}.{KEY}")[0] for e in pattern_unit(node[KEY], path))
    return {name: found[name].target for name in names if name in found}


def named_by_pattern(cfg, choices: dict[str, str]) -> dict[str, str]:
    """A cell whose pos (attn) has a pattern is named by it: ``rope×3+none``."""
    from harness.model.layers import pattern_label

    choices = dict(choices)
    for group in GROUPS:
        node = cfg.get(group)
        if has_pattern(node):
            choices[group] = pattern_label(pattern_unit(node[KEY], group))
    return choices
