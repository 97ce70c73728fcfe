"""Tuning sweeps (experiment=tune_lr): one seeded TPE study per grid cell, every trial a child of the
sweep's one parent run, each cell's best values in best.json (python -m results tune), and
optim.tuned running a cell at them with the rate logged as its param."""

from harness.sweep.tune import split_grid


def test_comma_lists_are_cells_and_the_rest_is_searched_or_fixed():
    cells, rest = split_grid(
        [
            "pos=rope,t5",
            "attn=softmax",
            "optim.optimizer.lr=tag(log, interval(1e-4, 1e-2))",
            "seed=0,1",
            "pos.base=choice(100,1000)",
        ]
    )
    assert cells == [["pos=rope", "seed=0"], ["pos=rope", "seed=1"], ["pos=t5", "seed=0"], ["pos=t5", "seed=1"]]
    assert rest == ["attn=softmax", "optim.optimizer.lr=tag(log, interval(1e-4, 1e-2))", "pos.base=choice(100,1000)"]
    assert split_grid(["attn=softmax"]) == ([[]], ["attn=softmax"])  # no axis: one study


def test_a_checked_tune_sweep_says_it_trained_nothing():
    """run.py --check drops the sweep callback; the tuner then reports checked trials, not failed ones."""
    from omegaconf import OmegaConf

    from harness.sweep.tune import CellwiseOptunaSweeper

    tuner = CellwiseOptunaSweeper.__new__(CellwiseOptunaSweeper)
    tuner.config = OmegaConf.create({"hydra": {"callbacks": {"mlflow_sweep": {"_target_": "x"}}}})
    assert not tuner._checking()
    tuner.config = OmegaConf.create({"hydra": {"callbacks": {}}})
    assert tuner._checking()


class _Return:
    """A Hydra JobReturn as the study reads it: ``return_value`` re-raises a failed job's exception."""

    def __init__(self, value):
        self.value = value

    @property
    def return_value(self):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class _Launcher:
    def __init__(self, values):
        self.values = values

    def launch(self, job_overrides, initial_job_idx):
        return [_Return(v) for v in self.values]


def test_the_counting_launcher_counts_the_trials_that_returned_a_finite_loss():
    from harness.sweep.tune import CountingLauncher

    launcher = CountingLauncher(_Launcher([RuntimeError("refused"), None, float("nan"), "abc", 2.5, 3]))
    launcher.launch([["a=1"]] * 6, initial_job_idx=0)
    assert launcher.finished == 2


def _tuner(tmp_path, values, study_error: Exception | None, checking: bool = False):
    """The cellwise sweeper around a stand-in study whose trials return ``values`` and whose best-trial lookup
    raises ``study_error`` (optuna's ValueError when no trial completed)."""
    from omegaconf import OmegaConf

    from harness.sweep.tune import CellwiseOptunaSweeper, CountingLauncher

    class Study:
        n_trials, sampler = len(values), None
        launcher = CountingLauncher(_Launcher(values))

        def sweep(self, arguments):
            self.launcher.launch([arguments] * len(values), initial_job_idx=0)
            if study_error is not None:
                raise study_error
            OmegaConf.save(OmegaConf.create({"best_params": {"lr": 1e-3}, "best_value": 2.5}), tmp_path / "r.yaml")

    tuner = CellwiseOptunaSweeper.__new__(CellwiseOptunaSweeper)
    callbacks = {} if checking else {"mlflow_sweep": {"_target_": "x"}}
    tuner.config = OmegaConf.create({"hydra": {"callbacks": callbacks, "sweep": {"dir": str(tmp_path)}}})
    tuner.params, tuner.study, tuner.sampler = {}, Study(), None
    return tuner


def test_a_cell_whose_every_trial_failed_is_reported_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    import harness.sweep.tune as tune

    monkeypatch.setattr(tune, "RESULTS", "r.yaml")
    _tuner(tmp_path, [RuntimeError("refused"), None], ValueError("optuna: no completed trial")).sweep(["pos=rope,t5"])
    assert capsys.readouterr().out.splitlines() == [
        "tune: pos=rope: no trial finished (refused or failed; see the sweep's table)",
        "tune: pos=t5: no trial finished (refused or failed; see the sweep's table)",
    ]
    _tuner(tmp_path, [None, None], ValueError("no completed trial"), checking=True).sweep(["pos=rope"])
    assert capsys.readouterr().out == "tune: (no grid axes): 2 trials checked (--check trains nothing)\n"


def test_another_error_of_a_study_whose_trials_finished_is_not_taken_for_no_trial_finished(tmp_path, monkeypatch):
    import pytest

    import harness.sweep.tune as tune

    monkeypatch.setattr(tune, "RESULTS", "r.yaml")
    with pytest.raises(ValueError, match="a real fault"):
        _tuner(tmp_path, [2.5, None], ValueError("a real fault")).sweep(["pos=rope"])
    _tuner(tmp_path, [2.5, 3.0], None).sweep(["pos=rope"])  # and a study that finished names its best


def test_a_presets_axis_the_command_line_pins_is_one_study(tmp_path, monkeypatch):
    """``+experiment/<preset>/arm=rope`` pins the preset's ``+experiment/<preset>/arm: rope,drope`` axis, as it does
    in the basic sweeper and in the sweep's name (harness/config/load.py preset_axes): one study, not one per arm."""
    from omegaconf import OmegaConf

    import harness.sweep.tune as tune

    monkeypatch.setattr(tune, "RESULTS", "r.yaml")
    tuner = _tuner(tmp_path, [2.5], None)
    tuner.params = {"+experiment/drope/arm": "rope,drope", "optim.optimizer.lr": "tag(log, interval(1e-4, 3e-2))"}
    studies = []

    def study(arguments):
        studies.append(arguments)
        OmegaConf.save(OmegaConf.create({"best_params": {"lr": 1e-3}, "best_value": 2.5}), tmp_path / "r.yaml")

    monkeypatch.setattr(tuner.study, "sweep", study, raising=False)
    tuner.sweep(["+experiment/drope/arm=rope", "++optim.optimizer.lr=1e-3"])
    assert studies == [["+experiment/drope/arm=rope", "++optim.optimizer.lr=1e-3"]]


def test_a_trials_searched_values_are_read_as_its_job_read_them():
    """Optuna writes a chosen rate of 1e-5 as ``optim.optimizer.lr=1e-05``: a float to Hydra, which trained the
    trial at it, and to best.json, whose reader (optim.tuned) takes numbers only."""
    from results.cells import Cell
    from results.tune import searched_values

    trial = Cell("r", "n", "l", "rope", "softmax", "0", "finished")
    trial.variant = "optim.optimizer.lr=1e-05 optim.schedule.warmup_steps=39 optim.optimizer.eps=1.5e-08"
    values = searched_values(trial)
    assert values == {"optim.optimizer.lr": 1e-05, "optim.schedule.warmup_steps": 39, "optim.optimizer.eps": 1.5e-08}
    assert [type(v) for v in values.values()] == [float, int, float]


def test_a_tuning_sweep_over_another_grid_axis_is_refused_before_it_starts():
    """best.json keeps one best per pos × attn: a comma list over data.seq_len would pool its studies under one key
    and write data.seq_len into the values optim.tuned applies to every later run of that cell."""
    import pytest

    from harness.config.load import cells
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data\.seq_len=32,64 is a grid axis"):
        cells(["experiment=tune_lr", "data.seq_len=32,64"])
    assert len(cells(["experiment=tune_lr", "seed=0,1"])) == 2 * 2 * 2 * 2  # pos × seed × two searched ranges' ends
