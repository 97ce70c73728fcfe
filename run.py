"""posbench entry point: ``python run.py [overrides]`` or ``python run.py -m pos=rope,learned``.

``python run.py --matrix`` (or ``--matrix=md``) prints which pos × attn pairings train, and why not.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.errors import ConfigError


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from harness.scaleout import rank_zero_print
    from harness.train import format_summary, train

    hydra_cfg = HydraConfig.get()
    choices = {g: hydra_cfg.runtime.choices[g] for g in ("pos", "attn", "task", "data")}
    if hydra_cfg.mode == RunMode.MULTIRUN:  # a cell of a sweep: record any failure, never stop the sweep
        from harness.sweep.callback import job_sweep_tags, run_cell

        return run_cell(cfg, choices, job_sweep_tags())
    try:
        summary = train(cfg, choices)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    rank_zero_print(format_summary(summary))  # DDP: every rank gets here; rank 0 speaks
    return summary.val_loss


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].split("=")[0] == "--matrix":  # before Hydra parses argv
        from harness.config.compat import print_matrix

        sys.exit(print_matrix(sys.argv[1]))
    from harness.cli import run_cli

    sys.exit(run_cli(main))  # Hydra's own errors, too, become one line naming the fix
