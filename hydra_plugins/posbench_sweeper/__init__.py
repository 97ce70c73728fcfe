"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` namespace; this one
names posbench's two, whose code is in harness/sweep/: tune.py (conf/hydra/sweeper/cellwise_optuna.yaml) and
stages.py (conf/config.yaml's hydra.sweeper: Hydra's basic sweeper, extended)."""

from harness.sweep import stages, tune


class CellwiseOptunaSweeper(tune.CellwiseOptunaSweeper):
    """One Optuna study per grid cell: see harness/sweep/tune.py."""


class StagedSweeper(stages.StagedSweeper):
    """Hydra's basic sweeper, plus seeds in stages: see harness/sweep/stages.py."""
