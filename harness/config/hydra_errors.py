"""Hydra's exceptions as the one line a user reads: what is wrong and what to change.

Hydra reports a mistake over several lines (a missing option lists one per line, an unknown key adds the struct
dump) and its text is not an interface. Each kind is told apart here by the exception's type and its structured
fields (``MissingConfigException.options``, ``OverrideParseException.override``, the OmegaConf error's
``full_key``) and by the command's own overrides, read with Hydra's parser (``overrides``): which one removed a
group, named a nested group, added a key, gave a mapping for a list. The one place Hydra's text is passed on is
``+key=`` on a key that exists, whose message already names both fixes.

May import: harness.config (its catalog and validation's group check), and the ground.
"""

from __future__ import annotations

import difflib
import sys

from harness.errors import ConfigError
from harness.paths import CONF


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _is_yaml_error(exc: BaseException) -> bool:
    import yaml

    return isinstance(exc, yaml.YAMLError)


def user_error(exc: BaseException, args: list[str] | None = None) -> str | None:
    """The one-line message for a user's mistake, or None for a crash that needs its traceback. ``args``: the
    command's Hydra arguments (default ``sys.argv[1:]``, which Hydra read), parsed by Hydra's own override parser to
    say which override caused a composition error."""
    from hydra import errors as hydra

    args = sys.argv[1:] if args is None else args
    if isinstance(exc, ConfigError):
        return one_line(exc)
    if _is_yaml_error(exc):  # a config file (conf/ or a --config-dir) that does not parse: where, and what
        return _yaml_error(exc)
    if isinstance(exc, hydra.SearchPathException):  # --config-dir that is not a folder: said where it is read
        from harness.config.catalog import user_config_dirs

        try:
            user_config_dirs(args)
        except ConfigError as e:
            return one_line(e)
    if isinstance(exc, hydra.MissingConfigException):  # pos=foo: Hydra lists the options one per line
        return _missing_option(exc)
    if isinstance(exc, hydra.OverrideParseException):
        return _unparsed(exc)
    if isinstance(exc, hydra.ConfigCompositionException):  # e.g. model.foo=1: an unknown key
        return _composition(exc, overrides(args))
    if isinstance(exc, hydra.InstantiationException) and isinstance(exc.__cause__, ConfigError):  # a plugin's check
        return one_line(exc.__cause__)
    if isinstance(exc, hydra.InstantiationException):  # a constructor's own error, past the schema
        return f"{one_line(exc)}; check the values of that config node (python run.py --cfg job prints them)"
    if isinstance(exc, ValueError):  # pos=null: Hydra's ValueError says a group override needs an option's name
        nulled = [o.key_or_group for o in overrides(args) if o.value() is None and not o.is_delete()
                  and (CONF / o.key_or_group).is_dir()]
        if nulled:
            return _nulled_group(nulled[0])
    if isinstance(exc, OSError) and exc.filename:  # e.g. hydra.run.dir under /proc or a read-only disk
        return (f"cannot write {exc.filename} ({exc.strerror}); choose a writable place "
                "(hydra.run.dir=, hydra.sweep.dir=, checkpoint.dir=, logger.tracking_uri=)")
    return None


def _yaml_error(exc) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
    what = " ".join(str(getattr(exc, "problem", None) or one_line(exc)).split())
    return f"{where} is not valid YAML ({what}); fix that file (each option of a config group is one YAML file)"


def _unparsed(exc) -> str:
    """An override Hydra's grammar rejects: a value with spaces or non-ASCII characters wants quoting."""
    key, _, value = str(exc.override).partition("=")
    if value and not (value.isascii() and " " not in value) and not value.startswith(("'", '"')):
        fix = f"quote the value for Hydra inside the shell's quotes: '{key}=\"{value}\"'"  # a path, a name
    else:
        fix = "write key=value, quoting values with special characters, e.g. 'eval.lengths=[128,256]'"
    return f"cannot parse override {exc.override!r}: {exc.message.splitlines()[0]}; {fix}"


def _nulled_group(group: str) -> str:
    return (f"{group}=null would remove a config group a run needs; pick one of its options "
            f"(python run.py --list lists them){', e.g. pos=none for no positions' * (group == 'pos')}")


def _composition(exc, given: list) -> str:
    """Hydra's composition errors, told apart by the override that caused them (Hydra's own parser) and the
    OmegaConf error under them (its ``full_key``), not by their text."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError

    cause = exc.__cause__
    removed = [o.key_or_group for o in given if o.is_delete() and (CONF / o.key_or_group).is_dir()]
    if cause is None and removed:  # ~pos: conf/config.yaml's defaults interpolate ${pos}
        from harness.config.validate import missing_group

        return missing_group(removed[0])
    nested = [o for o in given if "/" in o.key_or_group and not o.is_delete()]
    for o in nested if cause is None else []:  # pos/scaling=yarn under pos=alibi: not in its defaults list
        holders = _groups_listing(o.key_or_group)
        if holders:
            return (f"{o.key_or_group} is a choice of {', '.join(holders)} only, not of the chosen "
                    f"{o.key_or_group.rpartition('/')[0]}; pick one of those or drop {o.key_or_group}")
    if cause is None and any(o.is_add() for o in given):  # +key= on a key that exists: Hydra names both fixes
        return one_line(exc)
    if isinstance(cause, ConfigTypeError) and cause.full_key:  # phases={at: 3}: a mapping where a list is
        o = next((o for o in given if o.key_or_group == cause.full_key), None)
        if o is not None and isinstance(o.value(), (dict, list)):
            given_kind, wanted = ("a mapping", "a list") if isinstance(o.value(), dict) else ("a list", "a mapping")
            return (f"{o.input_line} gives {given_kind} where the config holds {wanted}; write it as {wanted}, e.g. "
                    f"{'[...]' if wanted == 'a list' else '{key: value}'}")
    key = cause.full_key if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key else None
    if key is None:
        return f"{one_line(exc)}; check the key's spelling in conf/ (python run.py --cfg job prints the whole config)"
    return _unknown_key(key)


def _unknown_key(key: str) -> str:
    """A key no option of its group defines: the options that do, the nested group that has it, the nearest
    name, or how to add a key the config does not list."""
    text = f"Could not override '{key}'."
    elsewhere = _options_with_key(key)
    if elsewhere:  # e.g. data.path under data=embedded: a key of the group's other options
        head = elsewhere[0].partition("=")[0]
        return (f"{key} is not a key of the chosen {head}; {', '.join(elsewhere)} "
                f"{'has' if len(elsewhere) == 1 else 'have'} it: add {elsewhere[0]} (or drop {key})")
    nested = _nested_options_with_key(key)
    if nested:  # e.g. pos.factor: a key of conf/pos/scaling/<method>.yaml, composed under pos.scaling
        group = nested[0].partition("=")[0]
        names = ", ".join(n.partition("=")[2] for n in nested if n.startswith(f"{group}="))
        return (f"{key} is not a key of the chosen {key.partition('.')[0]}; it belongs to {group}: pick one with "
                f"{group}=<name> ({names}) and set {group.replace('/', '.')}.{key.partition('.')[2]}=...")
    near = _nearest_name(key)
    if near:
        return f"{text} (no such key); did you mean {near}?"
    if "." in key and _parent_node(key) is not None:
        return (f"{text} (no such key); to pass a key the config does not list (e.g. another argument of "
                f"the class it builds) add it with +{key}=...")
    return f"{text} (no such key); check the key's spelling in conf/ (python run.py --cfg job prints the whole config)"


def _options_with_key(key: str) -> list[str]:
    """The options of ``key``'s group that define the rest of ``key`` (``data.path`` → ``data=enwik8``,
    ``data=text``; ``pos.scaling.alpha`` → ``pos/scaling=yarn``): the user picked an option without it."""
    import yaml

    from harness.paths import CONF

    parts = key.split(".")
    at = next((i for i in range(len(parts) - 1, 0, -1) if (CONF / "/".join(parts[:i])).is_dir()), None)
    if at is None:
        return []
    group, rest = "/".join(parts[:at]), parts[at:]

    def defines(node, parts: list[str]) -> bool:
        return not parts or (isinstance(node, dict) and parts[0] in node and defines(node[parts[0]], parts[1:]))

    return [f"{group}={f.stem}" for f in sorted((CONF / group).glob("*.yaml"))
            if defines(yaml.safe_load(f.read_text()) or {}, rest)]


def _groups_listing(group: str) -> list[str]:
    """The options of ``group``'s parent whose defaults list hold the nested ``group`` (``pos/scaling`` →
    ``pos=rope``, ``pos=rope_trainable``), directly or through an option they extend."""
    import yaml

    from harness.paths import CONF

    parent, _, sub = group.rpartition("/")

    def holds(name: str, seen: frozenset = frozenset()) -> bool:
        path = CONF / parent / f"{name}.yaml"
        if name in seen or not path.is_file():
            return False
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults", [])
        return any((isinstance(d, dict) and sub in d) or (isinstance(d, str) and holds(d, seen | {name}))
                   for d in defaults)

    return [f"{parent}={f.stem}" for f in sorted((CONF / parent).glob("*.yaml")) if holds(f.stem)]


def _nested_options_with_key(key: str) -> list[str]:
    """The options of a group nested in ``key``'s group that define ``key``'s last part (``pos.factor`` →
    ``pos/scaling=linear``, …): the key moved into a node of its own."""
    import yaml

    from harness.paths import CONF

    head, _, rest = key.partition(".")
    if not rest or "." in rest or not (CONF / head).is_dir():
        return []
    return [f"{head}/{sub.name}={f.stem}" for sub in sorted(p for p in (CONF / head).iterdir() if p.is_dir())
            for f in sorted(sub.glob("*.yaml")) if rest in (yaml.safe_load(f.read_text()) or {})]


def _nearest_name(key: str) -> str | None:
    """A config group (``poss`` → ``pos=``) or a key of the composed config (``model.dmodel``) near ``key``."""
    from harness.paths import CONF

    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra",))
    head, _, rest = key.partition(".")
    if not rest:
        near = difflib.get_close_matches(head, groups, n=1, cutoff=0.6)
        return f"{near[0]}=..." if near else None

    *parents, last = key.split(".")
    node = _parent_node(key)
    keys = list(node.keys()) if node is not None else []
    near = difflib.get_close_matches(last, keys, n=1, cutoff=0.6)
    return f"{'.'.join(parents)}.{near[0]}=..." if near else None


def _parent_node(key: str):
    """The config node ``key`` would live in (``model.dmodel`` → ``model``), or None."""
    from harness.config.compose import compose

    node = compose([])
    for part in key.split(".")[:-1]:
        node = node.get(part) if hasattr(node, "get") else None
    return node if hasattr(node, "keys") else None


def _missing_option(exc) -> str:
    """pos=foo: the option Hydra could not find (``missing_cfg_file``) and the group's options it lists."""
    missing, options = exc.missing_cfg_file or "", exc.options or []
    group = missing.rpartition("/")[0]
    if options and group:  # a preset's arms (experiment/<preset>/arm) are no defaults-list entry: added with '+'
        plus = "+" if group.startswith("experiment/") else ""
        return f"Could not find '{missing}'; use one of {plus}{group}={', '.join(options)}"
    return f"Could not find '{missing}'; see python run.py --help for the config groups and their options"


def overrides(args: list[str]) -> list:
    """``args``' overrides as Hydra's own parser reads them (key, type: change, add or delete, the parsed value);
    the flags and their values left out; [] where the parser refuses them (that error is said on its own)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    valued = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn"}
    kept = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    try:
        return OverridesParser.create().parse_overrides(kept)
    except Exception:
        return []
