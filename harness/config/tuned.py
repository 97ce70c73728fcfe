"""``optim.tuned=<best.json>``: run each cell at the values its own tuning study found.

A tuning sweep (``python run.py -m experiment=tune_lr``, harness/sweep/tune.py) and its report
(``python -m results tune --out results/tune_lr/``) leave ``best.json``: per cell ``pos=<p> attn=<a>``
the searched values (``optim.optimizer.lr``, ``optim.schedule.warmup_steps``). With ``optim.tuned`` set,
``load`` (harness/config/load.py) writes this cell's values, read here, into the config before
typing it, so the rate used is the run's ``optim.optimizer.lr`` param like any other. A file that is missing or
unreadable, changed since it was written (its ``sha256``, harness/integrity.py), a cell it does not hold, or a key the
config does not have is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness import integrity
from harness.errors import ConfigError


def tuned_values(path: str, pos: str, attn: str) -> dict:
    """The values best.json at ``path`` holds for the cell ``pos=<pos> attn=<attn>``."""
    file = Path(path).expanduser().absolute()
    try:
        record = json.loads(file.read_text())
        cells = record["cells"]
    except FileNotFoundError:
        raise ConfigError(
            f"optim.tuned={path}: no such file ({file}); run python -m results tune "
            "--out results/tune_lr/ after a tuning sweep, or drop optim.tuned"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"optim.tuned={path}: not a best.json of python -m results tune "
            f"({type(e).__name__}: {e}); point it at one, or drop optim.tuned"
        ) from None
    if not integrity.intact(record):  # results/tune.py seals it: a changed digit would be used silently
        raise ConfigError(
            f"optim.tuned={path}: {file} changed after python -m results tune wrote it (its sha256 "
            "no longer matches); write it again with python -m results tune --out, set "
            "optim.optimizer.lr yourself, or drop optim.tuned"
        )
    key = f"pos={pos} attn={attn}"  # results/tune.py cell_key
    if key not in cells:
        raise ConfigError(
            f"optim.tuned={path} has no tuned values for {key} (it has: {', '.join(sorted(cells))}); "
            f"tune it (python run.py -m experiment=tune_lr pos={pos} attn={attn}) or drop optim.tuned"
        )
    values = cells[key].get("values") if isinstance(cells[key], dict) else None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in values.items()
    ):
        raise ConfigError(
            f"optim.tuned={path}: the values for {key} are not a mapping of keys to numbers (got "
            f"{values!r:.60}); write it again with python -m results tune --out, or drop optim.tuned"
        )
    return values
