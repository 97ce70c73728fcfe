"""The ``posbench`` command (and ``python run.py``): Hydra's entry over conf/, then harness.cli's plumbing.

``posbench [overrides]``, ``posbench -m pos=rope,learned``, ``posbench --check ...`` and ``posbench --matrix``
behave as ``python run.py ...`` does in a checkout. conf/ is found beside this package (harness/paths.py),
so an installed copy composes from any working directory.

May import: harness.cli, and the ground.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from harness.allocator import keep_freed_memory
from harness.cli import entry, run_job
from harness.errors import ConfigError
from harness.paths import CONF


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


def main() -> int:
    """``posbench`` / ``python run.py`` with ``sys.argv``: exit status 0, or 2 after one line for a user's mistake."""
    try:
        keep_freed_memory()  # freed tensors reused by the next step, not page-faulted in again (harness/allocator.py)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return entry(sys.argv, hydra_main)  # Hydra's own errors, too, become one line naming the fix


if __name__ == "__main__":  # python -m harness.main: the DDP ranks of an installed copy (harness/scaleout.py)
    sys.exit(main())
