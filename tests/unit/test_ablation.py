"""``make run``'s default ablation (conf/experiment/ablation.yaml): pos=none, learned, rope × 3 seeds, its cells
side by side in worker processes, ending with a verdict per scheme against pos=none. A shortened run (a smaller
model, fewer steps) is read back from MLflow: every cell trained once under the sweep's parent, and the verdict
lines the sweep printed are the ones the store's numbers give (a Welch interval recomputed from the final losses,
a premature arm's order-gain curve)."""

from omegaconf import OmegaConf

from tests.helpers import ROOT, compose


def test_make_run_is_the_ablation_preset_three_arms_three_seeds_side_by_side():
    assert "run.py -m experiment=ablation" in (ROOT / "Makefile").read_text()
    cfg = compose(["experiment=ablation"])
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert params == {"pos": "none,learned,rope", "seed": "0,1,2"}
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == -1  # every core
    assert cfg.task._target_.endswith("MaskedLM") and cfg.data.source._target_.endswith("Embedded")
    assert (cfg.model.n_layers, cfg.trainer.max_steps, cfg.optim.schedule.decay) == (2, 150, "constant")
