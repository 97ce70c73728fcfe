"""``instantiate``: Hydra's, keeping a constructor's one-line ConfigError intact."""

from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate

from harness.errors import ConfigError, config_error_cause
from harness.extras import check_requires


def instantiate(node, **kwargs):
    """hydra.utils.instantiate, but a ConfigError raised by a constructor stays a ConfigError
    (Hydra wraps it in an InstantiationException, which would hide the one-line message), and a class whose
    declared packages (``requires``) are not installed is refused in one line before it is built."""
    check_requires(*target_of(node))  # harness/extras.py
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = config_error_cause(e)
        if cause is None:
            raise
        raise cause from None


def target_of(node) -> tuple[object, str]:
    """A config node's ``_target_`` (None where it has none) and its full key (``data.source``)."""
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig | dict):
        return None, ""
    return node.get("_target_"), node._get_full_key(None) if isinstance(node, DictConfig) else ""


def instantiate_option(node, path: str):
    """A ``_partial_`` option (pos, attn): the constructor Hydra prepares, whose one-line errors name the
    config keys. The classes word their errors by argument (``base=0 …``), as a library called directly
    should; built from ``path``'s node, ``pos.base=0 …`` says what to change on the command line.
    A node with ``layers`` (``pos.layers=[rope,none]``) gives a per-layer pattern (harness/config/layers.py)."""
    import inspect

    from harness.config.catalog import keyed
    from harness.config.layers import has_pattern, layer_pattern

    if path in ("pos", "attn") and has_pattern(node):  # pos.layers / attn.layers: a LayerPattern
        return layer_pattern(node, path, instantiate_option)
    sampling = {}
    if path == "pos":  # pos.randomize & co configure the wrapper any scheme takes (positional/randomized.py)
        from positional.randomized import KEYS

        sampling = {k: node[k] for k in KEYS if k in node}
        node = _without(node, KEYS)
    prepared = instantiate(node)
    names = list(inspect.signature(prepared.func).parameters) if hasattr(prepared, "func") else []
    if path == "pos":
        from positional.randomized import randomized

        prepared, names = randomized(prepared, **sampling), [*names, *sampling]

    def build(*args, **kwargs):
        try:
            return prepared(*args, **kwargs)
        except ConfigError as e:
            raise type(e)(keyed(str(e), path, names)) from None

    return build


def _without(node, keys):
    """``node`` (a DictConfig or dict) less ``keys``; a DictConfig's copy keeps its parent, so its interpolations
    (``${data.seq_len}``) still resolve."""
    import copy

    from omegaconf import DictConfig, open_dict

    if isinstance(node, DictConfig):
        trimmed = copy.deepcopy(node)
        with open_dict(trimmed):
            for key in keys:
                trimmed.pop(key, None)
        return trimmed
    return {k: v for k, v in node.items() if k not in keys}
