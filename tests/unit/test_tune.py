"""Tuning sweeps (experiment=tune_lr): one seeded TPE study per grid cell, every trial a child of the
sweep's one parent run, each cell's best values in best.json (python -m results tune), and
optim.tuned running a cell at them with the rate logged as its param."""



from harness.sweep.tune import split_grid


def test_comma_lists_are_cells_and_the_rest_is_searched_or_fixed():
    cells, rest = split_grid(["pos=rope,t5", "attn=softmax", "optim.optimizer.lr=tag(log, interval(1e-4, 1e-2))",
                              "seed=0,1", "pos.base=choice(100,1000)"])
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
