"""``python -m results report --experiment NAME [--sweep SWEEP_ID] --out results/NAME/``
``python -m results paper --preset NAME [--scale toy|paper|smoke] [--sweep SWEEP_ID]``
``python -m results tune [--experiment tune_lr] [--sweep SWEEP_ID] --out results/tune_lr/``
``python -m results index [--dir results/]``: results/README.md from the reports' own verdict lines

Rebuilds a sweep's comparison report (report.md, report.csv, PNG plots) from the MLflow
store; without --sweep, the experiment's latest sweep (or all its runs if it has none).
Bad input (a store that is not there, an unknown preset or experiment, an unwritable --out) is one
line on stderr and exit code 2, like run.py.
"""

from __future__ import annotations

import argparse
import sys

from harness.config.spec import ReportSettings
from harness.errors import ConfigError, OneLineParser, said_refusal, said_write_failure
from harness.paths import CONF, project_root
from harness.ranges import field_hints
from harness.record.preflight import number, output_dir
from results.paper import main as paper_main
from results.paper import write_index


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m results", description=__doc__.splitlines()[0])
    commands = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    report, paper, tune, index = (
        commands.add_parser(name, help=said)
        for name, said in (
            ("report", "write a sweep's comparison report from MLflow"),
            ("paper", "a paper preset's claim report (README.md with verdict)"),
            ("tune", "a tuning sweep's best values per cell (best.json, README.md)"),
            ("index", "rewrite results/README.md from the reports' verdict lines"),
        )
    )
    for sub, experiment in ((report, "posbench"), (tune, "tune_lr")):  # a sweep read back: the same four flags
        sub.add_argument("--experiment", default=experiment, help=f"MLflow experiment name (default: {experiment})")
        sub.add_argument("--sweep", default=None, help="sweep_id tag of the sweep (default: the latest sweep)")
        sub.add_argument("--out", required=True, help=f"output directory, e.g. results/{experiment}/")
        sub.add_argument(
            "--tracking-uri",
            default=None,
            help="MLflow store; default $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db",
        )
    declared = field_hints(ReportSettings)  # run.py's report.* ranges: one declaration for both
    report.add_argument(
        "--target",
        type=number(declared["target_loss"]),
        default=None,
        help="target val loss (nats/token) for 'steps to target'; default: the worst cell's final loss",
    )
    report.add_argument(
        "--min-order-gain",
        type=number(declared["min_order_gain"]),
        default=None,
        help="order gain (nats/token) below which a cell is 'not yet using order'; default: the sweep's "
        "report.min_order_gain, recorded before it ran (else 0.05)",
    )
    report.add_argument(
        "--baseline",
        default=None,
        metavar="POS",
        help="the pos to compare every scheme with; default: the sweep's report.baseline, recorded "
        "before it ran (else pos=none). A baseline given here is named as given after the run",
    )
    paper.add_argument("--preset", required=True, help="conf/experiment/<preset>.yaml")
    paper.add_argument(
        "--scale",
        default="toy",
        help="the sweep's scale, or its scales comma-separated (scale=toy,toy2x,toy4x: a verdict each)",
    )
    paper.add_argument("--sweep", default=None, help="sweep_id (default: the preset experiment's latest sweep)")
    paper.add_argument("--out", default=None, help="default: results/<preset>/")
    paper.add_argument("--tracking-uri", default=None)
    index.add_argument("--dir", default=None, help="the reports' folder (default: <project>/results)")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        commands = {"paper": _paper_command, "tune": _sweep_command, "report": _sweep_command, "index": _index_command}
        return commands[args.command](args)
    except (ConfigError, LookupError) as e:
        return said_refusal(e)
    except OSError as e:
        if not said_write_failure(
            e,
            "the report folder and the index were put back as they were: free space (or "
            "raise the limit) and run the command again",
        ):
            raise
        return 1


def _sweep_command(args) -> int:
    """``report`` and ``tune``: a sweep read back (``--experiment``, ``--sweep``) into the folder ``--out``."""
    from harness.integrity import report_folder
    from results import tune
    from results.report import write_report
    from results.store import find_sweep, open_store, regenerate_command, sweep_report

    out = output_dir(args.out)
    uri, client = open_store(args.tracking_uri)
    sweep = find_sweep(client, args.experiment, args.sweep)
    with report_folder(out) as staging:  # written whole or not at all, then sealed (harness/integrity.py)
        if args.command == "report":
            written = write_report(
                sweep_report(client, sweep, args.target, min_order_gain=args.min_order_gain, baseline=args.baseline),
                staging,
            )
        else:
            written = tune.write(client, sweep, staging, regenerate_command(sweep, out, command="tune"))
    # a committed tuning report: refresh the index, as `paper` does
    if args.command == "tune" and out.parent == project_root() / "results":
        write_index(out.parent)
    for path in written:
        print(out / path.name)
    return 0


def _index_command(args) -> int:
    from pathlib import Path

    folder = Path(args.dir) if args.dir else project_root() / "results"
    if not folder.is_dir():
        raise ConfigError(f"--dir {folder} is not a folder of reports; point it at one (default: results/)")
    write_index(folder)
    print(folder / "README.md")
    return 0


def _paper_command(args) -> int:
    # paper presets state a claim; a tuning preset (experiment=tune_lr) has none: `python -m results tune`
    presets = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if "\nclaim:" in p.read_text())
    if args.preset not in presets:
        raise ConfigError(f"--preset {args.preset!r} is not a preset; use one of {', '.join(presets)}")
    from harness.config.load import preset_scales

    scales = preset_scales(args.preset)
    for scale in args.scale.split(","):
        if scale not in scales:
            raise ConfigError(
                f"--scale {scale}: preset {args.preset} has no such scale; use one of "
                f"{', '.join(scales)} (several comma-separated for a sweep over scale)"
            )
    axis = "_scales" if "," in args.scale else ""  # a scale sweep's report beside the preset's own
    args.out = output_dir(args.out or project_root() / "results" / f"{args.preset}{axis}")
    return paper_main(args)


if __name__ == "__main__":
    sys.exit(main())
