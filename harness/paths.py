"""Where the project's own files are: the checkout root and its ``conf/``. Ground: imports nothing."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def project_root() -> Path:
    """The checkout holding run.py, or the working directory for an installed copy."""
    return ROOT if (ROOT / "run.py").exists() else Path.cwd()
