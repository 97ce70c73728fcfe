"""Paper presets (conf/experiment): each composes at both scales, every swept cell builds, and
every claim comparison names cells the sweep really produces."""

import functools
import itertools

import pytest
from omegaconf import OmegaConf

from results.paper import ARM_KEYS
from tests.helpers import ROOT
from tests.helpers import compose as compose_config

# presets that reproduce no paper, so make no claim: tuning (tests/unit/test_tune.py), make run's
# (tests/unit/test_ablation.py)
NO_CLAIM = {"tune_lr", "ablation"}
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if p.stem not in NO_CLAIM)


@functools.cache
def _compose(overrides: tuple[str, ...]):
    cfg = compose_config(list(overrides))
    OmegaConf.set_readonly(cfg, True)  # shared by the tests that compose it: a test that changed it fails here
    return cfg


def compose(overrides: list[str]):
    """The composed config (hydra node included), composed once per override list for the whole module: the
    tests read it and never change it, and several compose the same preset."""
    return _compose(tuple(overrides))


def sweep_cells(cfg) -> list[list[str]]:
    """The override lists the basic sweeper expands hydra.sweeper.params into (no glob here)."""
    params = cfg.hydra.sweeper.params
    axes = [
        [f"{k}={v}" for v in str(values).split(",")]
        for k, values in params.items()
        if not str(values).startswith("glob(")
    ]
    return [list(c) for c in itertools.product(*axes)]


def test_the_presets_exist():
    """PRESETS is every conf/experiment/*.yaml but NO_CLAIM: a new preset is tested here with nothing to add, and
    the exclusions are exactly the presets without a claim."""
    every = {p.stem: OmegaConf.load(p) for p in (ROOT / "conf" / "experiment").glob("*.yaml")}
    assert {
        "roformer_mlm",
        "roformer_performer",
        "eleuther_rotary",
        "su_trainable_theta",
        "su_linear_rope",
        "alibi_extrapolation",
        "grid",
        "nope_length_generalization",
        "randomized_positions",
        "rope_scaling",
        "partial_rope",
        "drope",
    } <= set(PRESETS)  # the glob finds them
    assert {name for name, cfg in every.items() if "claim" not in cfg} == NO_CLAIM


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("scale", ["toy", "paper"])
def test_preset_composes_and_names_its_claim(preset, scale):
    cfg = compose([f"experiment={preset}", f"scale={scale}"])
    assert cfg.logger.experiment == f"paper-{preset}"
    assert cfg.claim.source and cfg.claim.statement
    assert cfg.hydra.sweeper.params, "a preset is a sweep"
    toy_steps = compose([f"experiment={preset}"]).trainer.max_steps
    if scale == "paper":
        assert cfg.trainer.max_steps > toy_steps
    if scale == "toy":  # CPU-sized: the sweep's trainings, a task's or a scheme's own budget included, sum
        # to ≤ 125,000 steps (a toy sweep is meant to fit about half an hour on 2 cores)
        cells = sweep_cells(cfg)
        budget = {}  # the steps of each (task, pos) the sweep trains, budgets per task and per scheme included
        for c in cells:
            key = tuple(o for o in c if o.startswith(("task=", "pos=")))
            if key not in budget:
                budget[key] = compose([f"experiment={preset}", *key]).trainer.max_steps
        total = sum(budget[tuple(o for o in c if o.startswith(("task=", "pos=")))] for c in cells)
        assert total <= 125_000, f"{len(cells)} trainings, {total} steps"
    labels = {o for cell in sweep_cells(cfg) for o in cell}
    for comparison in OmegaConf.to_container(cfg.claim.comparisons, resolve=True):
        for side in ARM_KEYS:  # lower_than_metric names a metric, not an arm
            if side in comparison:  # an arm is one override of the sweep, or several (task=copy pos=rope)
                for override in comparison[side].split():
                    assert override in labels, f"{override} is not a cell of the sweep"


# grid: its axes are glob(*) over conf/pos × conf/attn, which sweep_cells leaves out; every pairing is built by
# tests/unit/test_fullgraph.py and tests/unit/test_implied_weights.py
@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "grid"])
def test_every_toy_cell_builds_its_model(preset):
    from harness.config.load import load
    from harness.data.tokenizer import ByteTokenizer
    from harness.model.transformer import Transformer

    base = compose([f"experiment={preset}"])
    for cell in sweep_cells(base):
        if cell[-1].startswith("seed=") and cell[-1] != "seed=0":
            continue
        spec = load([f"experiment={preset}", *cell], multirun=True)  # one cell of the sweep
        task = spec.task.build(tokenizer=ByteTokenizer())
        model = Transformer(
            spec.model,
            258,
            task.sequence_tokens(spec.data.seq_len),
            task.causal,
            pos=spec.pos.factory(),
            attn=spec.attn.factory(),
        )
        assert model.num_params() > 0


def test_grid_smoke_is_one_seed_of_the_toy_grid_with_fewer_steps():
    toy, smoke = compose(["experiment=grid"]), compose(["experiment=grid", "scale=smoke"])
    assert str(smoke.hydra.sweeper.params.seed) == "0" and str(toy.hydra.sweeper.params.seed) == "0,1,2"
    assert smoke.trainer.max_steps < toy.trainer.max_steps
    assert smoke.model == toy.model and smoke.task == toy.task  # the same cells, only shorter


# a preset's budget per task or per scheme, in its folder: conf/experiment/<preset>/<axis>/<scale>/<option>.yaml, read
# into trainer (a task's by conf/config.yaml's defaults, a scheme's by that scale file's own)
BUDGETS = sorted(
    (p, axis) for axis in ("task", "pos") for p in (ROOT / "conf" / "experiment").glob(f"*/{axis}/*/*.yaml")
)


def _budget(path, axis) -> tuple[str, str, str, int]:
    """(preset, scale, option, steps) of a budget file."""
    return path.parents[2].name, path.parent.name, path.stem, OmegaConf.load(path).max_steps


def swept(preset: str, scale: str, axis: str) -> list[str]:
    cfg = compose([f"experiment={preset}", f"scale={scale}"])
    return str(cfg.hydra.sweeper.params.get(axis, cfg.hydra.runtime.choices[axis])).split(",")


def test_a_budget_names_a_preset_scale_and_option_the_preset_sweeps():
    """A budget file is an optional group's option: a misspelt file would be skipped in silence, so each must name a
    preset, one of its scales and a task (or scheme) the preset sweeps."""
    assert {axis for _, axis in BUDGETS} == {"task", "pos"}, "no preset has a per-task or per-scheme budget"
    for path, axis in BUDGETS:
        preset, scale, option, _ = _budget(path, axis)
        assert (ROOT / "conf" / "experiment" / f"{preset}.yaml").exists(), path
        assert (ROOT / "conf" / "experiment" / preset / "scale" / f"{scale}.yaml").exists(), path
        assert option in swept(preset, scale, axis), f"{path}: {axis}={option} is not swept by experiment={preset}"


@pytest.mark.parametrize(("path", "axis"), BUDGETS, ids=lambda x: "/".join(x.parts[-4:]) if hasattr(x, "parts") else x)
def test_a_budget_moves_its_own_cells_only(path, axis):
    preset, scale, option, budget = _budget(path, axis)
    scale_steps = OmegaConf.load(ROOT / "conf" / "experiment" / preset / "scale" / f"{scale}.yaml").trainer.max_steps
    assert budget != scale_steps, f"{path} repeats the scale's steps"
    assert compose([f"experiment={preset}", f"scale={scale}", f"{axis}={option}"]).trainer.max_steps == budget
    for other in (o for o in swept(preset, scale, axis) if not (path.parent / f"{o}.yaml").exists()):
        assert compose([f"experiment={preset}", f"scale={scale}", f"{axis}={other}"]).trainer.max_steps == scale_steps
    # the command line still wins over the preset's budget, and without experiment= nothing moves
    assert (
        compose([f"experiment={preset}", f"scale={scale}", f"{axis}={option}", "trainer.max_steps=7"]).trainer.max_steps
        == 7
    )
    assert compose([f"{axis}={option}"]).trainer.max_steps == compose([]).trainer.max_steps
