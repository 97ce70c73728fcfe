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


def staged(tmp_path, means: dict[str, float], launcher: Launcher | None = None, **report) -> Launcher:
    sweeper = StagedSweeper(max_batch_size=None, params={"pos": ",".join(means)})
    settings = {"seeds": "auto", "stage": 3, "max_seeds": 9, "spending": "pocock", "alpha": 0.05, "baseline": None}
    sweeper.config = OmegaConf.create({"report": {**settings, **report}, "hydra": {"sweep": {"dir": str(tmp_path)}}})
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    sweeper.launcher = launcher = launcher or Launcher(means)
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
        # a preset's claim: its comparisons of two arms are the family (results/paper.py's claim_family)
        (["experiment=rope_scaling"], "claim.comparisons[0] is two metrics of one arm; run fixed seeds"),
        (
            ["experiment=partial_rope", "+experiment/partial_rope/arm=rope_full,nope"],
            "no cell of this sweep is +experiment/partial_rope/arm=rope_10",
        ),
        (["experiment=randomized_positions", "scale=toy,toy2x"], "run one scale per sweep"),
    ],
)
def test_a_sweep_it_cannot_stage_is_refused_before_it_starts(overrides, message):
    from harness.config.load import cells
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        cells(
            ["report.seeds=auto", *(["pos=none,rope"] if overrides[0][:4] not in ("pos=", "expe") else []), *overrides]
        )


def test_a_presets_seed_axis_gives_way_to_the_looks():
    from harness.config.load import cells

    assert cells(["experiment=ablation", "report.seeds=auto"]) == [
        ["pos=none", "experiment=ablation", "report.seeds=auto"],
        ["pos=learned", "experiment=ablation", "report.seeds=auto"],
        ["pos=rope", "experiment=ablation", "report.seeds=auto"],
    ]


@pytest.mark.parametrize("pin", ["seed=5", "++seed=5", "~seed"])
def test_a_presets_axis_the_command_line_sets_is_not_swept(pin):
    """However the command line sets a key, it pins the preset's axis of that key, as a run without -m reads it
    (harness/config/load.py check_runnable) and as the sweep's parent run is named: ``++seed=5`` is three cells,
    one per pos, not nine where each pos's seed=0, 1 and 2 are three runs of seed 5."""
    from harness.config.load import cells

    assert [sorted(cell) for cell in cells(["experiment=ablation", pin])] == [
        sorted([f"pos={pos}", "experiment=ablation", pin]) for pos in ("none", "learned", "rope")
    ]


CLAIM = [
    {"metric": "val/loss", "lower": "pos=rope", "than": "pos=none"},
    {"metric": "val/loss", "close": "pos=learned", "to": "pos=none", "within": 0.02},
]


SETTINGS = {"seeds": "auto", "stage": 3, "max_seeds": 9, "spending": "pocock", "alpha": 0.05, "baseline": None}


def staged_sweep(tmp_path, launcher, means: dict[str, float]) -> dict[str, list[int]]:
    """The sweeper under report.seeds=auto with CLAIM, on a stand-in launcher: the seeds each pos trained."""
    sweeper = StagedSweeper(max_batch_size=None, params={"pos": ",".join(means)})
    sweeper.config = OmegaConf.create(
        {
            "report": {**SETTINGS, "min_order_gain": 0.05},
            "claim": {"comparisons": CLAIM},
            "hydra": {"sweep": {"dir": str(tmp_path)}},
        }
    )
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    sweeper.launcher = launcher
    sweeper.sweep([])
    return {pos: sorted(s for p, s in launcher.jobs if p == pos) for pos in means}


def test_a_preset_with_a_claim_adds_seeds_by_its_comparisons_and_the_report_replays_them(tmp_path, monkeypatch):
    """A claim's comparisons are the family: rope's large lead is decided with the first 3 seeds; learned's 0.06
    from none against a ±0.02 agreement claim (spread 0.05) takes more. The paper report, reading the same cells,
    decides the same comparisons at the same looks with the same seeds."""
    from harness.sweep import stages
    from results.paper import staged_outcomes

    means = {"none": 3.0, "rope": 2.0, "learned": 2.94}
    launcher = Launcher(means)

    def cells():
        return [
            Cell(f"{pos}{seed}", "n", f"pos={pos}", pos, "softmax", str(seed), "finished", val=[(1, loss)], metrics={})
            for (pos, seed), loss in zip(launcher.jobs, _losses(launcher), strict=True)
        ]

    monkeypatch.setattr(stages, "_store_cells", lambda sweep_dir: (None, cells()))
    seeds = staged_sweep(tmp_path, launcher, means)
    assert seeds["rope"] == [0, 1, 2] and len(seeds["learned"]) > 3 and seeds["none"] == seeds["learned"]

    design = design_of(OmegaConf.create(SETTINGS))
    rope, learned = staged_outcomes(None, cells(), CLAIM, design, gain=-1.0)
    assert rope.verdict == "supports" and rope.text.endswith("decided at look 1 of 3") and "n = 3 vs 3" in rope.text
    n = len(seeds["learned"])
    assert f"n = {n} vs {n}" in learned.text and learned.hypotheses == 2
    # 0.047 measured beyond ±0.02, not beyond it by enough at 9 seeds: never "supports", undecided here
    assert learned.verdict == "inconclusive" and learned.text.endswith("undecided after look 3 of 3")


def test_a_comparison_whose_arm_is_not_yet_using_order_stops_at_the_first_look(tmp_path, monkeypatch):
    """The same sweep, learned not yet using word order (order gain 0 < 0.05): more seeds cannot train it longer, so
    its comparison ends with the first look's 3 seeds (it took more above) and the report calls it premature."""
    from harness.sweep import stages
    from results.paper import staged_outcomes

    means = {"none": 3.0, "rope": 2.0, "learned": 2.94}
    launcher = Launcher(means)

    def cells():
        return [
            Cell(f"{pos}{seed}", "n", f"pos={pos}", pos, "softmax", str(seed), "finished", val=[(1, loss)], metrics=m)
            for (pos, seed), loss in zip(launcher.jobs, _losses(launcher), strict=True)
            for m in [{"val/order_gain": 0.0 if pos == "learned" else 0.5}]
        ]

    monkeypatch.setattr(stages, "_store_cells", lambda sweep_dir: (None, cells()))
    seeds = staged_sweep(tmp_path, launcher, means)
    assert seeds == {"none": [0, 1, 2], "rope": [0, 1, 2], "learned": [0, 1, 2]}
    rope, learned = staged_outcomes(None, cells(), CLAIM, design_of(OmegaConf.create(SETTINGS)), gain=0.05)
    assert rope.verdict == "supports" and learned.verdict == "premature" and "n = 3 vs 3" in learned.text


class Refusing(Launcher):
    """``Launcher``, except that every job of a pos in ``refused`` fails (an incompatible pairing): no loss."""

    def __init__(self, means: dict[str, float], refused: set[str]):
        super().__init__(means)
        self.refused = refused

    def launch(self, batch, initial_job_idx):
        out = super().launch(batch, initial_job_idx)
        return [
            SimpleNamespace(return_value=None) if dict(o.split("=", 1) for o in job)["pos"] in self.refused else r
            for job, r in zip(batch, out, strict=True)
        ]


def test_a_cell_whose_every_seed_failed_takes_no_more_seeds_nor_keeps_its_baseline_training(tmp_path):
    """t5 is refused on every seed (no loss to compare): its comparison ends at the first look, so neither t5 is
    launched again nor none trained past what rope's comparison needs (rope is decided at the first look)."""
    means = {"none": 3.0, "rope": 2.0, "t5": 0.0}
    launcher = staged(tmp_path, means, Refusing(means, {"t5"}))
    seeds = {pos: sorted(s for p, s in launcher.jobs if p == pos) for pos in ("none", "rope", "t5")}
    assert seeds == {"none": [0, 1, 2], "rope": [0, 1, 2], "t5": [0, 1, 2]}


def test_the_report_replays_a_sweep_with_a_refused_cell_in_the_sweepers_family(tmp_path):
    """t5 is refused on every seed; its comparison still held a hypothesis of the sweeper's Holm family (declared
    before any result). The report, reading the runs, judges with that family: rope (0.08 below none, spread 0.05)
    is decided with the seeds and at the look the sweeper decided it."""
    means = {"none": 3.0, "rope": 2.92, "t5": 0.0}
    launcher = staged(tmp_path, means, Refusing(means, {"t5"}))
    cells = [
        Cell(f"{pos}{seed}", "n", f"pos={pos}", pos, "softmax", str(seed), "finished", val=[(1, loss)], metrics={})
        if pos != "t5"
        else Cell(f"{pos}{seed}", "n", f"pos={pos}", pos, "softmax", str(seed), "incompatible")
        for (pos, seed), loss in zip(launcher.jobs, _losses(launcher), strict=True)
    ]
    n = sum(1 for pos, _ in launcher.jobs if pos == "rope")
    assert n == 9  # the sweeper decided rope at its last look
    design = design_of(OmegaConf.create({"alpha": 0.05, "stage": 3, "max_seeds": 9, "spending": "pocock"}))
    found = {v.group.pos: v for v in verdicts(build_report(cells, "t", []).groups, -1.0, staged=design)}
    assert found["rope"].verdict == "lower"
    assert "look 3 of 3" in found["rope"].text and f"n = {n} vs {n}" in found["rope"].text


def test_a_sweeps_comparison_whose_arm_is_not_yet_using_order_stops_at_the_first_look(tmp_path, monkeypatch):
    """A sweep without a claim: learned (0.06 from none, which took more seeds above) is not yet using word order
    (order gain 0 < 0.05), so its comparison ends with the first look's 3 seeds, as a claim's does, and the report,
    replaying the looks from the same runs, calls it premature and rope lower at look 1; t5, refused on every seed,
    ends there too, with no verdict. The parent's look tag gives each its own reason."""
    from harness.sweep import stages
    from harness.sweep.callback import SweepRecord

    means = {"none": 3.0, "rope": 2.0, "learned": 2.94, "t5": 0.0}
    launcher = Refusing(means, {"t5"})

    def cells():
        return [
            Cell(f"{pos}{seed}", "n", f"pos={pos} seed={seed}", pos, "softmax", str(seed), "finished", val=[(1, loss)])
            if pos != "t5"
            else Cell(f"{pos}{seed}", "n", f"pos={pos} seed={seed}", pos, "softmax", str(seed), "incompatible")
            for (pos, seed), loss in zip(launcher.jobs, _losses(launcher), strict=True)
        ]

    SweepRecord("parent", "sweep", "sqlite:///unused.db", "posbench", ["pos", "seed"]).save(tmp_path)
    reads: list[int] = []  # the store is read once per look, not once per comparison asked

    def store_cells(record):
        reads.append(1)
        return None, _gains(cells())

    monkeypatch.setattr(stages, "_store_cells", store_cells)
    tags: dict[str, str] = {}
    parent = SimpleNamespace(set_tag=lambda run, key, value: tags.update({key: value}), log_metric=lambda *a, **k: None)
    monkeypatch.setattr(stages, "Store", SimpleNamespace(open=lambda uri: SimpleNamespace(client=parent)))
    sweeper = StagedSweeper(max_batch_size=None, params={"pos": ",".join(means)})
    sweeper.config = OmegaConf.create(
        {"report": {**SETTINGS, "min_order_gain": 0.05}, "hydra": {"sweep": {"dir": str(tmp_path)}}}
    )
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    sweeper.launcher = launcher
    sweeper.sweep([])
    seeds = {pos: sorted(s for p, s in launcher.jobs if p == pos) for pos in means}
    assert seeds == {"none": [0, 1, 2], "rope": [0, 1, 2], "learned": [0, 1, 2], "t5": [0, 1, 2]}
    assert len(reads) == 1
    assert tags["look_1"] == (
        "3 seeds per arm: pos=rope vs pos=none: lower; pos=learned vs pos=none: premature (not yet using word order: "
        "train longer); pos=t5 vs pos=none: no verdict (a side has no finished seed)"
    )
    design = design_of(OmegaConf.create(SETTINGS))
    found = {v.group.pos: v for v in verdicts(build_report(_gains(cells()), "t", []).groups, 0.05, staged=design)}
    assert found["learned"].verdict == "premature" and "t5" not in found
    assert found["rope"].verdict == "lower" and "look 1 of 3" in found["rope"].text


def _gains(cells: list[Cell]) -> list[Cell]:
    """The cells with an order gain: learned 0 (not yet using word order), none none by construction, rope 0.5."""
    for c in cells:
        c.metrics = {"val/order_gain": 0.0 if c.pos in ("learned", "none") else 0.5}
        c.order_signal = "none" if c.pos == "none" else "scheme"
    return cells


def test_a_sweep_run_again_with_other_report_settings_adopts_the_seeds_it_trained():
    """report.* says how a sweep judges its cells, not what a cell trains: raising report.max_seeds to continue an
    inconclusive staged sweep, declaring report.seeds=auto after fixed seeds, or a margin, keeps each cell's
    config_hash, so its FINISHED runs are adopted (harness/sweep/cell.py skip_finished) and not trained again."""
    from harness.config.load import load
    from harness.record.resume import config_hash
    from tests.helpers import TINY

    def hashed(*report: str) -> str:
        return config_hash(load([*TINY, "pos=rope", "seed=0", *report], multirun=True).values, "sqlite:///s.db")

    assert hashed("report.seeds=auto", "report.max_seeds=20", "report.margin=0.02") == hashed()
    assert hashed("seed=1") != hashed()  # what a cell trains still tells configs apart
