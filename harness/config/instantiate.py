"""``instantiate``: Hydra's, keeping a constructor's one-line ConfigError intact."""

from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate

from harness.errors import ConfigError


def instantiate(node, **kwargs):
    """hydra.utils.instantiate, but a ConfigError raised by a constructor stays a ConfigError
    (Hydra wraps it in an InstantiationException, which would hide the one-line message)."""
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None
