"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace; this one
names posbench's, whose code is harness/sweep/tune.py (conf/hydra/sweeper/cellwise_optuna.yaml)."""

from harness.sweep import tune


class CellwiseOptunaSweeper(tune.CellwiseOptunaSweeper):
    """One Optuna study per grid cell: see harness/sweep/tune.py."""
