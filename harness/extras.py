"""Optional packages: which extra of posbench brings each, and the one-line refusal when one is missing.

A class that needs a package posbench does not always install declares it, ``requires = ("tokenizers",)``
(import names), and ``check_requires`` reads the declaration before the class is built (``harness.config
.values`` calls it on every node a check reads), so
``--check`` refuses the option in one line instead of the run crashing on its first import. The extra named in
the fix is read from posbench's own metadata (pyproject.toml's ``[project.optional-dependencies]``), not from a
table kept here; a user's class may declare any package, and is told to pip install it by name.

May import: the ground only (harness.errors), and Hydra.
"""

from __future__ import annotations

import importlib.util
import re

from harness.errors import ConfigError


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported here (not: not installed, or blocked)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that does not import; sys.modules[name] = None
        return False


def extra_for(module: str) -> str | None:
    """The extra of posbench whose requirements name ``module``'s distribution (``tokenizers`` → ``hf``)."""
    from importlib import metadata

    try:
        requirements = metadata.requires("posbench") or []
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, never installed
        return None
    want = _normal(module)
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if name and extra and _normal(name[0]) == want and extra[1] != "test":
            return extra[1]
    return None


def require(owner: str, modules: tuple[str, ...]) -> None:
    """Refuse ``owner`` (``tokenizer=bpe``) in one line when a package it declares is not installed."""
    gone = [module for module in modules if not _importable(module)]
    if not gone:
        return
    extras = {extra_for(m) for m in gone}
    if len(extras) == 1 and None not in extras:
        extra = extras.pop()
        fix = f"pip install 'posbench[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
    else:
        fix = f"pip install {' '.join(gone)}"
    verb = "is" if len(gone) == 1 else "are"
    raise ConfigError(f"{owner} needs {' and '.join(gone)}, which {verb} not installed here; {fix}")


def check_requires(target: str, key: str) -> None:
    """The packages the class ``target`` (a config node's ``_target_``) declares are installed; the option is named
    as the user chose it, from the node's ``key``: ``tokenizer=bpe``, ``data=hf`` (the node ``data.source``),
    ``pos=rope``. A name that does not import declares nothing."""
    from hydra.utils import get_object

    try:
        cls = get_object(target)
    except Exception:  # a class that does not import: the caller's instantiate reports it
        return
    requires = tuple(getattr(cls, "requires", ()))
    if requires:
        name = cls.config_name() if callable(getattr(cls, "config_name", None)) else cls.__module__.rsplit(".")[-1]
        require(f"{key.split('.')[0]}={name}", requires)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()
