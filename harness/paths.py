"""Where the project's own files are: the package root and its ``conf/``. Ground: imports nothing.

Two installs, one layout: in a checkout (``pip install -e .``) ``ROOT`` is the repository; in an installed
copy (``pip install .``) it is site-packages, where ``conf/`` ships as package data beside ``harness/``.
What a run writes (mlflow.db, outputs/, multirun/, checkpoints/, results/) goes to ``project_root()``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def in_checkout() -> bool:
    """True in the repository (editable install or none), False in an installed copy."""
    return (ROOT / "pyproject.toml").is_file() and (ROOT / "run.py").is_file()


def project_root() -> Path:
    """The checkout holding run.py, or the working directory for an installed copy: never site-packages."""
    return ROOT if in_checkout() else Path.cwd()
