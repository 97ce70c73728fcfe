"""Tuning sweeps: one Optuna study per grid cell, through Hydra's Optuna sweeper.

Hydra's Optuna sweeper (hydra-optuna-sweeper) runs one study over everything swept: ``pos=rope,t5``
becomes a categorical dimension TPE samples like the learning rate, so a cell TPE dislikes early gets
few trials and its "best" rate is a guess. A fair comparison needs each pos × attn cell's own best
rate, so ``CellwiseOptunaSweeper`` keeps the Optuna sweeper's config interface and splits the sweep:

- a plain comma list (``pos=rope,t5``, ``attn=softmax,local``) is a **grid axis**: one study per
  combination, all in one Hydra multirun, so every trial is a child of the sweep's one MLflow parent
  run (``harness.sweep.callback.MlflowSweep``);
- ``interval(...)``, ``tag(log, interval(...))``, ``range(...)``, ``choice(...)`` (in ``params`` or on
  the command line) are the **search space** of each cell's study.

Each study starts from a copy of the configured sampler as it was built (TPE with a fixed seed), so
a cell's trials do not depend on which cells ran before it. A trial that fails or is refused returns
no loss: Optuna records it FAILED and the study goes on; a cell where no trial finished (a refused
pairing) is reported and skipped. Pruning from intermediate val loss is not possible here: the
sweeper launches each trial as a Hydra job and only sees its return value (no trial object reaches
the training loop), and hydra-optuna-sweeper 1.3 offers no pruner.

"""

from __future__ import annotations

import copy
import itertools
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError

log = logging.getLogger(__name__)
RESULTS = "optimization_results.yaml"  # what hydra-optuna-sweeper writes into the sweep dir per study


def split_grid(arguments: list[str]) -> tuple[list[list[str]], list[str]]:
    """The sweep's overrides as grid cells (each a list of ``key=value``, the product of the plain comma
    lists) and the rest (fixed values and search-space sweeps, handed to each cell's study)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    axes, rest = [], []
    for line, override in zip(arguments, OverridesParser.create().parse_overrides(arguments), strict=True):
        value = override.value()
        if isinstance(value, ChoiceSweep) and value.simple_form:  # `a,b`, not `choice(a,b)`
            axes.append([f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()])
        else:
            rest.append(line)
    return [list(cell) for cell in itertools.product(*axes)], rest


class CountingLauncher(Launcher):
    """The study's launcher, counting the trials that returned a finite loss (those Optuna records COMPLETE): a
    study with none has no best trial, which each cell then reports instead of raising."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher, self.finished = launcher, 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        returns = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        self.finished += sum(_finite_loss(ret) for ret in returns)
        return returns


def _finite_loss(ret) -> bool:
    try:
        return math.isfinite(float(ret.return_value))  # return_value re-raises a failed job's exception
    except Exception:
        return False


class CellwiseOptunaSweeper(Sweeper):
    """hydra-optuna-sweeper's options (``sampler``, ``direction``, ``n_trials``, ``n_jobs``, ``params``,
    ...), one study per grid cell. Registered as conf/hydra/sweeper/cellwise_optuna.yaml."""

    config: DictConfig  # the job's config, from ``setup`` (Hydra calls it before ``sweep``)

    def __init__(self, params: DictConfig | None = None, **optuna_options) -> None:
        try:
            from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
        except ImportError:
            raise ConfigError(
                "hydra/sweeper=cellwise_optuna (experiment=tune_lr) needs hydra-optuna-sweeper; "
                "pip install -e '.[tune]'"
            ) from None

        for key in ("n_trials", "n_jobs"):
            value = optuna_options.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"hydra.sweeper.{key}={value!r} must be a positive integer "
                    f"({'trials per cell' if key == 'n_trials' else 'trials run at once'})"
                )
        # split here: the grid axes among them are not Optuna's
        self.params: dict[str, object] = {str(k): v for k, v in (params or {}).items()}
        self.study = OptunaSweeperImpl(params=None, **optuna_options)
        self.sampler = copy.deepcopy(self.study.sampler)  # as built: every cell's study starts from it

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.study.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        assert self.study.launcher is not None, "the study's setup builds its launcher"
        self.study.launcher = CountingLauncher(self.study.launcher)

    def _checking(self) -> bool:
        """``run.py --check`` drops the sweep callback (harness/cli.py): every trial returns no loss."""
        return "mlflow_sweep" not in (self.config.hydra.get("callbacks") or {})

    def sweep(self, arguments: list[str]) -> None:
        from harness.config.load import preset_axes

        cells, rest = split_grid([*(f"{k}={v}" for k, v in preset_axes(self.params, arguments).items()), *arguments])
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        counter = self.study.launcher
        assert isinstance(counter, CountingLauncher), "setup wraps the study's launcher"
        best = {}
        for cell in cells:
            key = " ".join(cell)  # best.json's key (harness/config/load.py)
            label = key or "(no grid axes)"
            log.info(f"tuning {label}: {self.study.n_trials} trials")
            self.study.sampler = copy.deepcopy(self.sampler)
            counter.finished = 0
            try:
                self.study.sweep([*rest, *cell])
            except ValueError:  # optuna's study.best_trial, when no trial of the study completed
                if counter.finished:
                    raise
                print(
                    f"tune: {label}: "
                    + (
                        f"{self.study.n_trials} trials checked (--check trains nothing)"
                        if self._checking()
                        else "no trial finished (refused or failed; see the sweep's table)"
                    )
                )
                continue
            results = OmegaConf.to_container(OmegaConf.load(sweep_dir / RESULTS))
            assert isinstance(results, dict), f"hydra-optuna-sweeper writes a mapping to {RESULTS}"
            best[key] = {"params": results["best_params"], "value": results["best_value"]}
            print(f"tune: {label}: best {results['best_value']:.4f} at {results['best_params']}")
        OmegaConf.save(OmegaConf.create(best), sweep_dir / RESULTS)  # every cell's, not only the last study's
