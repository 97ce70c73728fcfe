"""report.seeds=auto's sweeper (harness/sweep/stages.py) with a stand-in launcher whose "training" returns a
loss per (pos, seed): which seeds it trains look by look, and that the report replays the same decisions."""

import random
import re
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from harness.sweep.stages import StagedSweeper, comparisons, design_of, names
from results.cells import Cell, build_report
from results.verdicts import verdicts


class Launcher:
    """Each job's loss: its pos's mean plus noise fixed by (pos, seed)."""

    def __init__(self, means: dict[str, float]):
        self.means, self.jobs = means, []

    def launch(self, batch, initial_job_idx):
        out = []
        for job in batch:
            found = dict(o.split("=", 1) for o in job)
            self.jobs.append((found["pos"], int(found["seed"])))
            noise = random.Random(f"{found['pos']}/{found['seed']}").gauss(0, 0.05)
            out.append(SimpleNamespace(return_value=self.means[found["pos"]] + noise))
        return out


def staged(tmp_path, means: dict[str, float], **report) -> Launcher:
    sweeper = StagedSweeper(max_batch_size=None, params={"pos": ",".join(means)})
    settings = {"seeds": "auto", "stage": 3, "max_seeds": 9, "spending": "pocock", "alpha": 0.05, "baseline": None}
    sweeper.config = OmegaConf.create({"report": {**settings, **report}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    sweeper.launcher = launcher = Launcher(means)
    sweeper.sweep([])
    return launcher


def test_a_large_effect_is_settled_by_the_first_look(tmp_path):
    launcher = staged(tmp_path, {"none": 3.0, "rope": 2.0})
    assert sorted(launcher.jobs) == [("none", 0), ("none", 1), ("none", 2), ("rope", 0), ("rope", 1), ("rope", 2)]


def test_a_small_effect_takes_more_seeds_and_only_its_own(tmp_path):
    """rope is far from none (decided at the first look); learned only 0.06 nats away with a spread of 0.05: it and
    its baseline go on, rope does not."""
    launcher = staged(tmp_path, {"none": 3.0, "rope": 2.0, "learned": 2.94})
    seeds = {pos: sorted(s for p, s in launcher.jobs if p == pos) for pos in ("none", "rope", "learned")}
    assert seeds["rope"] == [0, 1, 2]
    assert len(seeds["learned"]) > 3 and seeds["none"] == seeds["learned"] == list(range(len(seeds["learned"])))


def test_the_report_replays_the_sweepers_decisions_from_the_runs(tmp_path):
    """The cells the stand-in trained, as the report reads them from MLflow, judged with the design the sweep
    recorded: the same seeds per look, so the same verdicts."""
    means = {"none": 3.0, "rope": 2.0, "learned": 2.94}
    launcher = staged(tmp_path, means)
    cells = [
        Cell(f"{pos}{seed}", "n", f"pos={pos}", pos, "softmax", str(seed), "finished", val=[(1, loss)], metrics={})
        for (pos, seed), loss in zip(launcher.jobs, _losses(launcher), strict=True)
    ]
    design = design_of(OmegaConf.create({"alpha": 0.05, "stage": 3, "max_seeds": 9, "spending": "pocock"}))
    found = {v.group.pos: v for v in verdicts(build_report(cells, "t", []).groups, -1.0, staged=design)}
    assert found["rope"].verdict == "lower" and "look 1 of 3" in found["rope"].text
    n = sum(1 for pos, _ in launcher.jobs if pos == "learned")
    assert f"n = {n} vs {n}" in found["learned"].text


def _losses(launcher: Launcher) -> list[float]:
    return [launcher.means[pos] + random.Random(f"{pos}/{seed}").gauss(0, 0.05) for pos, seed in launcher.jobs]


def test_cells_are_named_by_what_varies_and_compared_with_the_baseline_of_their_other_overrides():
    cells = [[f"pos={p}", f"attn={a}", "data.seq_len=32"] for a in ("softmax", "local") for p in ("none", "rope")]
    named = names(cells)
    assert list(named) == [
        "pos=none attn=softmax",
        "pos=rope attn=softmax",
        "pos=none attn=local",
        "pos=rope attn=local",
    ]
    assert comparisons(named, "none") == [
        ("pos=rope attn=softmax", "pos=none attn=softmax"),
        ("pos=rope attn=local", "pos=none attn=local"),
    ]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["seed=0,1"], "report.seeds=auto trains each arm's seeds itself"),
        (["pos=rope,t5"], "decides each pos against the baseline pos=none (report.baseline)"),
        (["experiment=tune_lr"], "adds seeds through posbench's own sweeper"),
    ],
)
def test_a_sweep_it_cannot_stage_is_refused_before_it_starts(overrides, message):
    from harness.config.load import cells
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        cells(["report.seeds=auto", *(["pos=none,rope"] if "pos" not in overrides[0] else []), *overrides])


def test_a_presets_seed_axis_gives_way_to_the_looks():
    from harness.config.load import cells

    assert cells(["experiment=ablation", "report.seeds=auto"]) == [
        ["pos=none", "experiment=ablation", "report.seeds=auto"],
        ["pos=learned", "experiment=ablation", "report.seeds=auto"],
        ["pos=rope", "experiment=ablation", "report.seeds=auto"],
    ]
