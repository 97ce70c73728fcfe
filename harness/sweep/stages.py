"""Seeds in stages: ``report.seeds=auto`` trains each arm's seeds look by look until its comparison is decided.

``StagedSweeper`` is Hydra's basic sweeper (conf/config.yaml's ``hydra.sweeper``, the default) with one addition: under
``report.seeds=auto`` the sweep's cells take no ``seed`` axis; each look trains the seeds the comparisons still
running lack (seeds 0 … n − 1: ``report.stage`` at the first look, as many more at each later one, up to
``report.max_seeds``), reads their final losses, and lets harness/sequential.py decide the family — each pos
against the baseline of its attention and other overrides (``report.baseline``, else ``pos=none``), the
comparisons of the whole sweep one Holm family, boundaries spent over the looks (``report.spending``). A preset
with a claim is decided by the claim's comparisons instead, each on its own metric read back from the store
(results/paper.py's ``claim_family``; a cell no comparison reads keeps the first look's seeds). A
comparison stops taking seeds once decided, when more could not decide it, or when an arm is not yet using word
order (the report's readiness: more seeds do not train a model longer); its baseline trains while any
comparison with it runs. Each look's decisions go on the sweep's parent run (tags ``look_<k>``, metrics
``stages/running`` and ``stages/trained`` by look), and the report replays the same decisions from the runs
(results/verdicts.py). A stopped sweep run again adopts its finished seeds and continues where its looks were.
Without ``report.seeds=auto`` it is the basic sweeper, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from harness import sequential
from harness.config.load import claim_comparisons, in_arm, preset_axes
from harness.record.store import Store
from harness.sweep.callback import SweepRecord


def design_of(report: DictConfig) -> sequential.Design:
    """The design the sweep's ``report`` node declares (no ``margin`` in it: none)."""
    margin = report.get("margin")
    return sequential.Design(
        alpha=float(report.alpha),
        stage=int(report.stage),
        most=int(report.max_seeds),
        spending=report.spending,
        margin=None if margin is None else float(margin),
    )


def names(cells: list[list[str]]) -> dict[str, list[str]]:
    """Each cell by its name, the overrides that vary across the sweep (``pos=rope attn=local``), and its
    overrides."""
    varying = {o.partition("=")[0] for o in {o for cell in cells for o in cell} if not all(o in c for c in cells)}
    return {" ".join(o for o in cell if o.partition("=")[0] in varying): cell for cell in cells}


def comparisons(cells: dict[str, list[str]], baseline: str) -> list[tuple[str, str]]:
    """(arm, its baseline) per named cell: the cell with ``pos=<baseline>`` and the same other overrides is its
    baseline; cells without one are not compared."""
    by_rest = {_rest(cell): name for name, cell in cells.items() if f"pos={baseline}" in cell}
    return [
        (name, by_rest[_rest(cell)])
        for name, cell in cells.items()
        if f"pos={baseline}" not in cell and _rest(cell) in by_rest
    ]


def _rest(cell: list[str]) -> tuple[str, ...]:
    return tuple(o for o in cell if not o.startswith("pos="))


class StagedSweeper(BasicSweeper):
    """Hydra's basic sweeper; under ``report.seeds=auto``, seeds in stages (this module's docstring)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        # BasicSweeper.__init__'s assignments, without its super(BasicSweeper, self) call: Hydra's plugin scan
        # re-imports its core plugins, so that name may be another class object than the one this derives from
        self.overrides, self.batch_index, self.max_batch_size, self.params = None, 0, max_batch_size, params or {}
        self.hydra_context, self.config, self.launcher = None, None, None

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        self.params = preset_axes(self.params, arguments)  # Hydra's would sweep seed=0,1,2 under ++seed=5 too
        report = self.config.report
        if report.seeds != "auto":
            return super().sweep(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        preset = [o for o in self._parse_config() if not o.startswith("seed=")]  # its seed axis: the looks' now
        cells = self.split_arguments(parser.parse_overrides([*preset, *arguments]), None)[0]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        record = SweepRecord.load(sweep_dir)  # the sweep callback's, written before the sweeper starts
        named = names(cells)
        losses: dict[str, list[float | None]] = {name: [] for name in named}  # by seed: None where it failed
        trained: list[int] = []  # seeds trained by each look
        returns: list[Sequence[Any]] = []
        launcher = self.launcher

        def train(need: dict[str, int]) -> None:
            jobs = [(name, s) for name, n in need.items() for s in range(len(losses[name]), n)]
            if jobs:
                batch = [[*named[name], f"seed={s}"] for name, s in jobs]
                launched = launcher.launch(batch, initial_job_idx=sum(trained[-1:]))
                for (name, _), result in zip(jobs, launched, strict=True):
                    losses[name].append(result.return_value)  # a job that raised re-raises here, as in the basic one
                returns.append(launched)
            trained.append(sum(len(v) for v in losses.values()))

        def draw(need: dict[str, int]) -> dict[str, list[float]]:
            train(need)
            return {name: [x for x in losses[name][:n] if x is not None] for name, n in need.items()}

        def draw_claim(need: dict[str, int]) -> dict[str, list[float]]:  # keys <index>:<arm> (results/paper.py)
            arms = [(key.partition(":")[2], n) for key, n in need.items()]
            # a cell in no running comparison (an arm only secondary comparisons read) keeps the first look's seeds
            train(
                {
                    name: max([n for arm, n in arms if in_arm(cell, arm)], default=design.stage)
                    for name, cell in named.items()
                }
            )
            return claim_values(*_store_cells(record), claim, need)

        design = design_of(report)
        claim = claim_comparisons(self.config)
        from results.verdicts import first_seeds, premature_at

        @functools.cache
        def looked(n: int) -> list:  # the sweep's runs as the look of n seeds saw them, read once per look
            return first_seeds(_store_cells(record)[1], n)

        if claim:
            from results.paper import claim_family, claim_values, not_ready

            gain = OmegaConf.select(self.config, "claim.min_order_gain", default=report.min_order_gain)
            stop = not_ready(looked, claim, float(gain))
            family = sequential.settle(claim_family(claim), design, draw_claim, stop)
        else:

            def stop(c: sequential.Comparison, n: int) -> bool:  # the report's premature, at this look's seeds
                if record is None:  # no sweep callback, no runs to read (run.py --check)
                    return False
                return premature_at([x for x in looked(n) if in_arm(x.label.split(), c.arm)], report.min_order_gain)

            family = sequential.settle(comparisons(named, report.baseline or "none"), design, draw, stop)
        _record(record, family, design, trained, stop)
        return returns


def _store_cells(record: SweepRecord | None) -> tuple[Any, list]:
    """(the store's client, the sweep's runs as report cells) for a look that reads its arms' metrics."""
    from results.store import cells_of, find_sweep

    assert record is not None, "the sweep callback writes its record before the first look"
    client = Store.open(record.tracking_uri).client
    return client, cells_of(client, find_sweep(client, record.experiment, record.sweep_id))


def _record(
    record: SweepRecord | None,
    family: list[sequential.Comparison],
    design: sequential.Design,
    trained: list[int],
    stop: Callable[[sequential.Comparison, int], bool],
) -> None:
    """Each look's decisions on the sweep's parent run (none without the sweep callback, as under run.py --check): a
    tag per look, and by look the comparisons still running and the runs trained so far. ``stop``: settle's."""
    if record is None:
        return
    client = Store.open(record.tracking_uri).client
    for k, (n, runs) in enumerate(zip(design.looks, trained, strict=False)):
        said = "; ".join(
            f"{_shown(c.arm)} vs {_shown(c.baseline)}: {_ended(c, n, k == len(design.looks) - 1, stop)}"
            for c in family
            if c.decided_at == k
        )
        client.set_tag(record.parent_run_id, f"look_{k + 1}", f"{n} seeds per arm: {said or 'nothing decided'}"[:5000])
        running = sum(1 for c in family if c.decided_at is not None and c.decided_at > k)
        client.log_metric(record.parent_run_id, "stages/running", running, step=k + 1)
        client.log_metric(record.parent_run_id, "stages/trained", runs, step=k + 1)


def _ended(c: sequential.Comparison, n: int, last: bool, stop: Callable[[sequential.Comparison, int], bool]) -> str:
    """Why ``c`` ended at the look of ``n`` seeds, in the words of the report (results/verdicts.py), which shows no
    verdict for a comparison with no finished seed on a side."""
    return (
        c.verdict
        if c.verdict != "inconclusive"
        else "no verdict (a side has no finished seed)"
        if not (c.a and c.b)
        else "premature (not yet using word order: train longer)"
        if stop(c, n)
        else f"inconclusive ({'the last look' if last else 'more seeds could not decide it'})"
    )


def _shown(key: str) -> str:
    """A comparison's side as the dashboard shows it: a claim's ``<index>:<arm>`` as ``claim[<index>] <arm>``."""
    index, colon, arm = key.partition(":")
    return f"claim[{index}] {arm}" if colon and index.isdigit() else key
