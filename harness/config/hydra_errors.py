"""An exception as the one line a user reads: what is wrong and what to change, or None for a crash.

Hydra reports a mistake over several lines and its text is not an interface: each kind is told apart by the
exception's type and structured fields (``MissingConfigException.options``, ``OverrideParseException.override``,
the OmegaConf error's ``full_key``) and by the command's own overrides, read with Hydra's parser. Where a key lives
is the catalogue's to say (harness/config/catalog.py reads conf/).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from harness.config import catalog
from harness.config.load import compose, parsed_overrides
from harness.errors import ConfigError, one_line


def user_error(exc: BaseException, args: list[str]) -> str | None:
    """The one-line message for a user's mistake, or None; ``args``: the command's Hydra arguments."""
    import yaml
    from hydra import errors as hydra

    if isinstance(exc, ConfigError):
        return one_line(exc)
    if isinstance(exc, yaml.YAMLError):  # a config file (conf/ or a --config-dir) that does not parse
        mark = getattr(exc, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
        what = one_line(getattr(exc, "problem", None) or exc)
        return f"{where} is not valid YAML ({what}); fix that file (each option of a config group is one YAML file)"
    if isinstance(exc, hydra.SearchPathException):  # --config-dir that is not a folder
        try:
            catalog.user_config_dirs(args)
        except ConfigError as e:
            return one_line(e)
    if isinstance(exc, hydra.MissingConfigException):  # pos=foo: Hydra lists the options one per line
        missing, options = exc.missing_cfg_file or "", exc.options or []
        group = missing.rpartition("/")[0]
        if options and group:  # a preset's arms (experiment/<preset>/arm) are no defaults-list entry: added with '+'
            return (
                f"Could not find '{missing}'; use one of {'+' * group.startswith('experiment/')}{group}="
                f"{', '.join(options)}"
            )
        return f"Could not find '{missing}'; see python run.py --help for the config groups and their options"
    if isinstance(exc, hydra.OverrideParseException):
        key, _, value = str(exc.override).partition("=")
        fix = (
            f"quote the value for Hydra inside the shell's quotes: '{key}=\"{value}\"'"
            if value and not (value.isascii() and " " not in value) and not value.startswith(("'", '"'))
            else "write key=value, quoting values with special characters, e.g. 'eval.lengths=[128,256]'"
        )
        return f"cannot parse override {exc.override!r}: {exc.message.splitlines()[0]}; {fix}"
    if isinstance(exc, hydra.InstantiationException) and isinstance(exc.__cause__, ConfigError):  # a plugin's check
        return one_line(exc.__cause__)
    if isinstance(exc, hydra.ConfigCompositionException):  # e.g. model.foo=1: an unknown key
        return _composition(exc, parsed_overrides(args))
    if isinstance(exc, ValueError):  # pos=null: Hydra's ValueError says a group override needs an option's name
        nulled = [
            o.key_or_group
            for o in parsed_overrides(args)
            if o.value() is None and not o.is_delete() and o.key_or_group in catalog.group_names()
        ]
        if nulled:
            return (
                f"{nulled[0]}=null would remove a config group a run needs; pick one of its options "
                f"(python run.py --list lists them){', e.g. pos=none for no positions' * (nulled[0] == 'pos')}"
            )
    if isinstance(exc, OSError) and exc.filename:  # e.g. hydra.run.dir under /proc or a read-only disk
        return (
            f"cannot write {exc.filename} ({exc.strerror}); choose a writable place "
            "(hydra.run.dir=, hydra.sweep.dir=, checkpoint.dir=, logger.tracking_uri=)"
        )
    return None


def _composition(exc: BaseException, given: list) -> str:
    """Hydra's composition errors, told apart by the override that caused them and the OmegaConf error under
    them (its ``full_key``), not by their text."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError

    from harness.config.values import missing_group

    cause = exc.__cause__
    removed = [o.key_or_group for o in given if o.is_delete() and o.key_or_group in catalog.group_names()]
    if cause is None and removed:  # ~pos: conf/config.yaml's defaults interpolate ${pos}
        return missing_group(removed[0])
    for o in [o for o in given if "/" in o.key_or_group and not o.is_delete()] if cause is None else []:
        holders = catalog.groups_listing(o.key_or_group)  # pos/scaling=yarn under pos=alibi
        if holders:
            return (
                f"{o.key_or_group} is a choice of {', '.join(holders)} only, not of the chosen "
                f"{o.key_or_group.rpartition('/')[0]}; pick one of those or drop {o.key_or_group}"
            )
    if cause is None and any(o.is_add() for o in given):  # +key= on a key that exists: Hydra names both fixes
        return one_line(exc)
    if isinstance(cause, ConfigTypeError) and cause.full_key:  # phases={at: 3}: a mapping where a list is
        o = next((o for o in given if o.key_or_group == cause.full_key), None)
        if o is not None and isinstance(o.value(), (dict, list)):
            given_kind, wanted = ("a mapping", "a list") if isinstance(o.value(), dict) else ("a list", "a mapping")
            return (
                f"{o.input_line} gives {given_kind} where the config holds {wanted}; write it as {wanted}, e.g. "
                f"{'[...]' if wanted == 'a list' else '{key: value}'}"
            )
    key = cause.full_key if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key else None
    if key is None:
        return f"{one_line(exc)}; check the key's spelling in conf/ (python run.py --cfg job prints the whole config)"
    return _unknown_key(key)


def _unknown_key(key: str) -> str:
    """A key no option of its group defines: the options that do, the nested group that has it, the nearest name,
    or how to add a key the config does not list."""
    text = f"Could not override '{key}'."
    elsewhere = catalog.options_with_key(key)
    if elsewhere:  # data.path under data=embedded: a key of the group's other options
        head = elsewhere[0].partition("=")[0]
        return (
            f"{key} is not a key of the chosen {head}; {', '.join(elsewhere)} "
            f"{'has' if len(elsewhere) == 1 else 'have'} it: add {elsewhere[0]} (or drop {key})"
        )
    nested = catalog.nested_options_with_key(key)
    if nested:  # pos.factor: a key of conf/pos/scaling/<method>.yaml, composed under pos.scaling
        group = nested[0].partition("=")[0]
        names = ", ".join(n.partition("=")[2] for n in nested if n.startswith(f"{group}="))
        return (
            f"{key} is not a key of the chosen {key.partition('.')[0]}; it belongs to {group}: pick one with "
            f"{group}=<name> ({names}) and set {group.replace('/', '.')}.{key.partition('.')[2]}=..."
        )
    near, node = _nearest(key)
    if near:
        return f"{text} (no such key); did you mean {near}?"
    if node is not None:
        return (
            f"{text} (no such key); to pass a key the config does not list (e.g. another argument of "
            f"the class it builds) add it with +{key}=..."
        )
    return f"{text} (no such key); check the key's spelling in conf/ (python run.py --cfg job prints the whole config)"


def _nearest(key: str) -> tuple[str | None, object]:
    """A config group (``poss`` → ``pos=``) or a key of the default config (``model.dmodel``) near ``key``, and the
    node ``key`` would live in (None if there is none)."""
    import difflib

    head, _, rest = key.partition(".")
    if not rest:
        near = difflib.get_close_matches(head, catalog.group_names(), n=1, cutoff=0.6)
        return (f"{near[0]}=..." if near else None), None
    node = OmegaConf.select(compose([]), key.rsplit(".", 1)[0], default=None)
    keys = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
    near = difflib.get_close_matches(key.rsplit(".", 1)[1], keys, n=1, cutoff=0.6)
    return (f"{key.rsplit('.', 1)[0]}.{near[0]}=..." if near else None), node if keys else None
