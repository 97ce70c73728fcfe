"""``load(overrides) -> RunSpec``: the one place a Hydra config is read.

Hydra's compose API composes conf/ (and the user's ``--config-dir``) with the command line's overrides; then, in
order: the preset and its scale exist, a class named on the command line (``pos._target_=mypkg.MyScheme``) names the
cell and keeps only the keys it takes, ``optim.tuned`` writes this cell's tuned values, every interpolation
resolves, and the resolved values are typed into a ``RunSpec`` (harness/config/values.py). A Hydra job, which gets
its config composed, makes its spec with ``from_job``; ``cells`` expands a sweep's overrides into its cells as
Hydra's basic sweeper does, so a check of a sweep is a loop of ``check(load(cell))``.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.conf import HydraConf
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from harness import integrity
from harness.config.catalog import check_interface, locate, option_name, target_overrides
from harness.config.spec import (
    Choices,
    Json,
    RunSettings,
    RunSpec,
)
from harness.config.values import (
    GROUPS,
    PLAIN,
    check_known,
    check_optimizer,
    choice,
    chosen,
    component,
    missing_group,
    name_of,
    node_of,
    own_node,
    pattern_unit,
    phases,
    settings,
    trainer_settings,
)
from harness.errors import ConfigError, one_line
from harness.model.transformer import ModelConfig
from harness.paths import CONF
from harness.ranges import field_hints

NAMED = ("pos", "attn", "task", "data", "experiment", "scale")  # the groups a run's cell is named by


@contextlib.contextmanager
def initialized() -> Iterator[object]:
    """Hydra's global state over conf/ for the calls inside (kept where it is already set); yields its loader."""

    ready = GlobalHydra.instance().is_initialized()
    with contextlib.nullcontext() if ready else initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def compose(overrides: Sequence[str] = (), config_dirs: Sequence[str] = (), hydra: bool = False) -> DictConfig:
    """The config ``python run.py <overrides>`` would see (with ``hydra`` to keep its hydra node)."""
    searched = [f"hydra.searchpath=[{','.join(f'file://{Path(d).expanduser().absolute()}' for d in config_dirs)}]"]
    with initialized():
        return hydra_compose(
            config_name="config",
            overrides=[*overrides, *(searched if config_dirs else [])],
            return_hydra_config=hydra or bool(config_dirs),
        )


def load(overrides: Sequence[str] = (), config_dirs: Sequence[str] = (), multirun: bool = False) -> RunSpec:
    """The run ``python run.py <overrides>`` describes (one cell of a sweep, with ``multirun``), typed and
    value-checked."""
    if not multirun:
        check_single(overrides)
    cfg = compose(overrides, config_dirs, hydra=True)
    choices = {g: cfg.hydra.runtime.choices.get(g) for g in NAMED}
    check_runnable(cfg.hydra, list(overrides), multirun)
    with open_dict(cfg):
        del cfg["hydra"]
    return spec(cfg, choices, list(overrides), list(config_dirs))


def from_job(cfg: DictConfig, multirun: bool) -> RunSpec:
    """The spec of the running Hydra job, from the config Hydra composed for it."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    check_runnable(hydra, list(hydra.overrides.task), multirun)
    dirs = [s.path for s in hydra.runtime.config_sources if s.schema == "file" and s.provider != "main"]
    return spec(cfg, {g: hydra.runtime.choices.get(g) for g in NAMED}, list(hydra.overrides.task), dirs)


def check_single(overrides: Sequence[str]) -> None:
    """A sweep's values (``seed=0,1``) in a command without -m: said in one line (Hydra lists three readings)."""
    swept = next((o for o in parsed_overrides(list(overrides)) if o.is_sweep_override()), None)
    if swept is not None:
        key = swept.get_key_element()
        raise ConfigError(
            f"{swept.input_line} is a sweep over several values: add -m to run a cell per value, or "
            f"write a list as {key}=[...] (quoted: '{key}=[a,b]')"
        )


def parsed_overrides(args: list[str]) -> list:
    """``args``' overrides as Hydra's own parser reads them; the flags and their values left out; [] where the
    parser refuses them (that error is said when the config is composed)."""
    valued = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn"}
    kept = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    try:
        return OverridesParser.create().parse_overrides(kept)
    except Exception:
        return []


def preset_axes(params: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """The preset's own sweep axes (``hydra.sweeper.params``) that the command line ``overrides`` leave to it: the
    command line wins however it sets a key (``seed=5``, ``++seed=5`` or ``~seed`` pins seed, ``+a=…`` pins ``+a``),
    in a run without -m, in every sweeper and in the sweep's name alike."""
    pinned = {o.partition("=")[0].lstrip("+~") for o in overrides}
    return {str(k): v for k, v in (params or {}).items() if str(k).lstrip("+") not in pinned}


def check_runnable(hydra: HydraConf, overrides: list[str], multirun: bool) -> None:
    """A preset that is a sweep, run without -m; an empty output folder."""
    axes = list(preset_axes(hydra.sweeper.get("params"), overrides))
    if axes and not multirun:  # experiment=grid without -m would train one run of the defaults, untuned
        raise ConfigError(
            f"experiment={hydra.runtime.choices.get('experiment')} is a sweep over {', '.join(axes)}: "
            f"add -m to run its cells, or pin {' and '.join(f'{a}=...' for a in axes)} for one run "
            "of it"
        )
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    if not str(hydra.sweep.dir if multirun else hydra.run.dir).strip():
        raise ConfigError(f"{key}='' names no directory; give one (e.g. {key}=outputs/mine) or leave it out")


def spec(cfg: DictConfig, choices: dict[str, str | None], overrides: list[str], config_dirs: list[str]) -> RunSpec:
    _check_preset(choices.get("experiment"), choices.get("scale"))
    names = {**choices, **retarget(cfg, overrides)}
    for group in ("pos", "attn"):
        layers = OmegaConf.select(cfg, f"{group}.layers", default=None)
        if layers is not None:
            from harness.model.layers import pattern_label

            unit = OmegaConf.to_container(layers) if isinstance(layers, ListConfig) else layers
            names[group] = pattern_label(pattern_unit(unit, group))
    tuned = _apply_tuned(cfg, str(names["pos"]), str(names["attn"]))
    named = Choices(str(names["pos"]), str(names["attn"]), str(names["task"]), str(names["data"]))
    try:
        return _spec_of(resolved(cfg), named, config_dirs)
    except ConfigError as e:
        key = next((k for k in tuned if str(e).startswith(f"{k}=")), None)
        if key is None:
            raise
        raise type(e)(f"{e} (the value comes from optim.tuned={tuned[key]})") from None


def resolved(cfg: DictConfig) -> Json:
    try:
        values = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # an interpolation that does not resolve (a missing key, a bad resolver)
        raise ConfigError(
            f"the config does not resolve: {one_line(e)}; "
            "check the ${...} references you set (python run.py --cfg job prints the config)"
        ) from None
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items()}


def preset_scales(preset: str) -> list[str]:
    """The scales a preset has sizes for (conf/experiment/<preset>/scale/<scale>.yaml)."""
    return sorted(p.stem for p in (CONF / "experiment" / preset / "scale").glob("*.yaml"))


def _check_preset(name: str | None, scale: str | None = None) -> None:
    """``experiment`` and its scale are optional, so Hydra skips an option that does not exist: refuse a preset that
    is not there, and a scale that preset has no sizes for (e.g. scale=smoke)."""
    presets = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    if name in (None, "null"):
        return
    if name not in presets:
        raise ConfigError(f"experiment={name} is not a preset; use one of experiment={', '.join(presets)}")
    scales = preset_scales(str(name))
    if scale and scale not in scales:
        raise ConfigError(
            f"experiment={name} has no scale={scale} (conf/experiment/{name}/scale/); use one of "
            f"scale={', '.join(scales)}"
        )


def retarget(cfg: DictConfig, overrides: list[str]) -> dict[str, str]:
    """``<group>._target_=pkg.Class`` on the command line: the cell takes the class's name, and of the replaced
    option's keys only those the class's constructor takes stay (keys the command line sets always stay, so one
    the class does not take is refused, not dropped). Returns the renamed groups."""
    names = {}
    for group, target in target_overrides(overrides).items():
        try:
            cls = locate(f"{group}._target_", target)
        except ConfigError:  # refused with its line when the node is typed
            continue
        check_interface(group, cls, target)
        keep = {
            n for n, p in inspect.signature(cls).parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        } | {
            o.partition("=")[0].lstrip("+").split(".")[1]
            for o in overrides
            if o.partition("=")[0].lstrip("+").startswith(f"{group}.")
        }
        with open_dict(cfg):
            for k in [k for k in cfg[group] if not str(k).startswith("_") and k not in keep]:
                del cfg[group][k]
        names[group] = option_name(cls)
    return names


def _apply_tuned(cfg: DictConfig, pos: str, attn: str) -> dict[str, str]:
    """Write this cell's tuned values into ``cfg`` when ``optim.tuned`` names a best.json (``tuned_values``), so
    the rate used is the run's ``optim.optimizer.lr`` param like any other; returns the keys written, each with the
    file it came from (a refusal of one of them names the file)."""
    path = OmegaConf.select(cfg, "optim.tuned", default=None)
    if path is None:
        return {}
    values = tuned_values(str(path), pos, attn)
    for key, value in values.items():
        if OmegaConf.select(cfg, key, default=None) is None:
            raise ConfigError(
                f"optim.tuned={path} sets {key}, which this config does not have; "
                "use a best.json tuned with the same optim and schedule, or drop optim.tuned"
            )
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)
    return {key: str(path) for key in values}


def tuned_values(path: str, pos: str, attn: str) -> dict:
    """The values best.json at ``path`` holds for the cell ``pos=<pos> attn=<attn>``: a tuning sweep (``python run.py
    -m experiment=tune_lr``, harness/sweep/tune.py) and its report (``python -m results tune --out results/tune_lr/``)
    leave it, per cell the searched values (``optim.optimizer.lr``, ``optim.schedule.warmup_steps``). A file that is
    missing or unreadable, changed since it was written (its ``sha256``, harness/integrity.py), or without this cell
    is refused in one line."""
    file = Path(path).expanduser().absolute()
    try:
        record = json.loads(file.read_text())
        cells = record["cells"]
    except FileNotFoundError:
        raise ConfigError(
            f"optim.tuned={path}: no such file ({file}); run python -m results tune "
            "--out results/tune_lr/ after a tuning sweep, or drop optim.tuned"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"optim.tuned={path}: not a best.json of python -m results tune "
            f"({type(e).__name__}: {e}); point it at one, or drop optim.tuned"
        ) from None
    if not integrity.intact(record):  # results/tune.py seals it: a changed digit would be used silently
        raise ConfigError(
            f"optim.tuned={path}: {file} changed after python -m results tune wrote it (its sha256 "
            "no longer matches); write it again with python -m results tune --out, set "
            "optim.optimizer.lr yourself, or drop optim.tuned"
        )
    key = f"pos={pos} attn={attn}"  # results/tune.py cell_key
    if key not in cells:
        raise ConfigError(
            f"optim.tuned={path} has no tuned values for {key} (it has: {', '.join(sorted(cells))}); "
            f"tune it (python run.py -m experiment=tune_lr pos={pos} attn={attn}) or drop optim.tuned"
        )
    values = cells[key].get("values") if isinstance(cells[key], dict) else None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in values.items()
    ):
        raise ConfigError(
            f"optim.tuned={path}: the values for {key} are not a mapping of keys to numbers (got "
            f"{values!r:.60}); write it again with python -m results tune --out, or drop optim.tuned"
        )
    return values


def _spec_of(values: Json, choices: Choices, config_dirs: Sequence[str]) -> RunSpec:
    """``values``: the resolved config (no hydra node); ``config_dirs``: the user's, where a pattern's or a phase's
    other options are found too."""
    missing = [g for g in GROUPS if not isinstance(values.get(g), dict) or not chosen(g, node_of(values, g))]
    if missing:  # ~pos, pos=null, or a preset that drops one
        raise ConfigError(missing_group(missing[0]))
    top = [*field_hints(RunSettings), "phases"]
    check_known("", list(values), [*top, *GROUPS, *PLAIN], "the config")
    for key, value in values.items():
        if key not in top and not isinstance(value, dict):
            raise ConfigError(
                f"{key}={value!r} replaces the config group {key}; pick an option with {key}=NAME "
                f"(python run.py --help lists them) or set one key with {key}.KEY=VALUE"
            )
    data_node = node_of(values, "data")
    nodes = {**values, "data": {k: v for k, v in data_node.items() if k != "source"}}  # data.source: a component
    plain: dict[str, Any] = {
        k: settings(c, k, node_of(nodes, k), f"data ({choices.data})" if k == "data" else k) for k, c in PLAIN.items()
    }
    run = settings(RunSettings, "", {k: v for k, v in values.items() if k in top and k != "phases"}, "the config")
    trainer = trainer_settings(node_of(values, "trainer"))
    if plain["progress"].mode != "auto" and not trainer.enable_progress_bar:
        raise ConfigError(
            f"progress.mode={plain['progress'].mode} asks for progress but "
            "trainer.enable_progress_bar=false turns it off; drop one of the two"
        )
    optim = node_of(values, "optim")
    check_known("optim", list(optim), ["optimizer", "schedule", "tuned"], "optim")
    optimizer = component("optim.optimizer", node_of(optim, "optimizer"), "optim.optimizer", supplied=("params",))
    check_optimizer(optimizer)
    model = component("model", node_of(values, "model"), "model").build()
    if not isinstance(model, ModelConfig):
        raise ConfigError("model._target_ must build a harness.model.transformer.ModelConfig; pick model=NAME")
    pos_node = node_of(values, "pos")
    pos = choice("pos", pos_node, choices.pos, config_dirs)
    return RunSpec(
        choices=choices,
        run=run,
        **plain,
        trainer=trainer,
        model=model,
        source=component("data.source", node_of(data_node, "source"), f"data={choices.data}"),
        tokenizer=component("tokenizer", node_of(values, "tokenizer"), f"tokenizer={name_of(values, 'tokenizer')}"),
        task=component("task", node_of(values, "task"), f"task={choices.task}", "task", ("tokenizer",)),
        pos=pos,
        attn=choice("attn", node_of(values, "attn"), choices.attn, config_dirs),
        optimizer=optimizer,
        schedule=component("optim.schedule", node_of(optim, "schedule"), "optim.schedule"),
        phases=phases(values.get("phases"), pos, own_node(pos_node), config_dirs),
        values=values,
    )


# ---------------------------------------------------------------- a sweep's cells


def cells(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> list[list[str]]:
    """Each cell of the sweep ``overrides`` describe, with the preset's own axes (``hydra.sweeper.params``), in
    Hydra's basic sweeper's order. A searched value (``interval(1e-4, 3e-2)``) is taken at both its ends."""
    for arg in overrides:  # the launcher's own count of parallel jobs (joblib also takes -1, every core)
        key, _, value = arg.lstrip("+").partition("=")
        for one in value.split(",") if key == "hydra.launcher.n_jobs" else []:
            if not one.strip().lstrip("-").isdigit() or int(one) == 0 or int(one) < -1:
                raise ConfigError(
                    f"hydra.launcher.n_jobs={one} must be a positive number of parallel jobs (or -1 for one per core)"
                )
    with initialized() as loader:
        parser = OverridesParser.create(config_loader=loader)  # type: ignore[arg-type]  # Hydra's own loader
        given = parser.parse_overrides(list(overrides))
        cfg = compose([_values(o)[0] for o in given], config_dirs, hydra=True)
        _check_sweeper(cfg.hydra.sweeper)
        params = cfg.hydra.sweeper.get("params")
        every = parser.parse_overrides([*(f"{k}={v}" for k, v in preset_axes(params, overrides).items()), *overrides])
    axes = {override.get_key_element(): _values(override) for override in every}
    if str(cfg.hydra.sweeper.get("_target_", "")).endswith(".CellwiseOptunaSweeper"):
        _check_tuning(every)
    if OmegaConf.select(cfg, "report.seeds") == "auto":  # the sweeper trains the seeds: a preset's seed axis goes
        _check_stages(cfg, axes, {o.get_key_element() for o in given})
        axes.pop("seed", None)
    return [list(cell) for cell in itertools.product(*axes.values())]


def _check_stages(cfg: DictConfig, axes: dict[str, list[str]], typed: set[str]) -> None:
    """report.seeds=auto: posbench's sweeper trains each arm's seeds and compares each pos with the baseline of its
    other overrides (harness/sweep/stages.py), so the sweep needs that sweeper, a pos axis holding the baseline, and
    no seed of its own."""
    target = str(cfg.hydra.sweeper.get("_target_", ""))
    if not target.endswith(".StagedSweeper"):
        raise ConfigError(
            f"report.seeds=auto adds seeds through posbench's own sweeper, and this sweep runs {target} "
            "(a tuning study runs its own trials); drop report.seeds=auto"
        )
    if "seed" in typed:
        raise ConfigError(
            f"report.seeds=auto trains each arm's seeds itself (0, 1, … up to report.max_seeds="
            f"{cfg.report.max_seeds}); drop seed=... from the sweep"
        )
    claim = claim_comparisons(cfg)
    if claim:
        _check_staged_claim(claim, axes)
        return
    pos = [value.partition("=")[2] for value in axes.get("pos", [])]
    baseline = cfg.report.baseline or "none"
    if len(pos) < 2 or baseline not in pos:
        raise ConfigError(
            f"report.seeds=auto decides each pos against the baseline pos={baseline} (report.baseline), and this "
            f"sweep's pos is {','.join(pos) or 'not swept'}; sweep pos with it, e.g. pos={baseline},rope"
        )


def _check_tuning(every: list) -> None:
    """A tuning sweep (harness/sweep/tune.py) runs a study per combination of its plain comma lists, and best.json
    (results/tune.py, read by optim.tuned) keeps one best per pos × attn: a grid axis over another key would pool its
    studies under one entry and put that key among the values optim.tuned writes into every later run."""
    from hydra.core.override_parser.types import ChoiceSweep

    for override in every:
        value, key = override.value(), override.get_key_element()
        if isinstance(value, ChoiceSweep) and value.simple_form and key.lstrip("+") not in ("pos", "attn", "seed"):
            raise ConfigError(
                f"{override.input_line} is a grid axis of this tuning sweep, whose best.json keeps one best per "
                f"pos × attn: its studies would be pooled and {key} set by optim.tuned; run one tuning sweep per "
                f"{key} value (each with its own python -m results tune --out)"
            )


def claim_comparisons(config: DictConfig) -> list[dict]:
    """The comparisons of the preset's claim (conf/experiment/<preset>.yaml), resolved: under report.seeds=auto a
    preset with a claim adds seeds by them, each a comparison of two arms (results/paper.py's ``claim_family``)."""
    claim = OmegaConf.select(config, "claim")
    if claim is None:
        return []
    return list(OmegaConf.to_container(claim, resolve=True).get("comparisons") or [])  # type: ignore[union-attr]  # a mapping


def in_arm(cell: list[str], arm: str) -> bool:
    """Whether a cell (its overrides) trains an arm of a claim (``task=copy pos=none``): each of the arm's overrides
    of a key the sweep sets is the cell's (a key it does not set is the preset's, the same for every cell)."""
    keys = {o.partition("=")[0] for o in cell}
    return all(o in cell for o in arm.split() if o.partition("=")[0] in keys)


def _check_staged_claim(claim: list[dict], axes: dict[str, list[str]]) -> None:
    """A preset's claim decided in stages: each comparison of two arms (not a threshold or two metrics of one arm,
    which have no staged test), each arm trained by some cell, one scale (each scale is a family of its own)."""
    if len(axes.get("scale", [])) > 1:
        raise ConfigError(
            "report.seeds=auto decides a claim's comparisons as one family, and a sweep over scale judges each "
            "scale as its own; run one scale per sweep (scale=toy, then scale=toy2x …)"
        )
    cells = [list(cell) for cell in itertools.product(*(v for k, v in axes.items() if k != "seed"))]
    for i, comparison in enumerate(claim):
        kind = next((k for k in ("lower", "higher", "close") if k in comparison), None)
        if kind is None:
            raise ConfigError(
                f"report.seeds=auto decides a claim's comparisons of two arms, and claim.comparisons[{i}] is "
                f"{'a threshold (below)' if 'below' in comparison else 'two metrics of one arm'}; run fixed seeds "
                "(drop report.seeds=auto)"
            )
        for arm in (comparison[kind], comparison["to" if kind == "close" else "than"]):
            if not any(in_arm(cell, arm) for cell in cells):
                raise ConfigError(
                    f"report.seeds=auto trains the arms of claim.comparisons[{i}], and no cell of this sweep is "
                    f"{arm}; sweep its overrides too, or drop report.seeds=auto"
                )


def _check_sweeper(node: DictConfig) -> None:
    """The sweeper's own settings (``hydra.sweeper.n_trials`` …), checked by building it: its constructor refuses
    a bad one before the sweep's parent run opens."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if str(node.get("_target_", "")).startswith("hydra."):  # Hydra's own (the basic sweeper): nothing to check
        return
    try:
        instantiate(node)
    except InstantiationException as e:
        cause = e.__cause__
        raise (cause if isinstance(cause, ConfigError) else e) from None


def _values(override) -> list[str]:  # noqa: ANN001 (Hydra's Override)
    """An override's values as single overrides: a list's each, a searched interval's two ends."""
    key = override.get_key_element()
    if not override.is_sweep_override():
        return [override.input_line]
    if override.is_discrete_sweep():
        return [f"{key}={v}" for v in override.sweep_string_iterator()]
    interval = override.value()
    return [f"{key}={interval.start}", f"{key}={interval.end}"]
