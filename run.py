"""posbench entry point: ``python run.py [overrides]`` or ``python run.py -m pos=rope,learned``.

``python run.py --check [overrides]`` validates a config (or, with -m, every cell of a sweep) without
training; ``python run.py --matrix`` (or ``--matrix=md``) prints which pos × attn pairings train.
"""

import sys

import hydra
from omegaconf import DictConfig

from harness.allocator import keep_freed_memory
from harness.cli import entry, run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":
    keep_freed_memory()  # freed tensors reused by the next step, not page-faulted in again (harness/allocator.py)
    sys.exit(entry(sys.argv, main))  # Hydra's own errors, too, become one line naming the fix
