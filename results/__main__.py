"""``python -m results report --experiment NAME [--sweep SWEEP_ID] --out results/NAME/``
``python -m results paper --preset NAME [--scale toy|paper] [--sweep SWEEP_ID]``

Rebuilds a sweep's comparison report (report.md, report.csv, PNG plots) from the MLflow
store; without --sweep, the experiment's latest sweep (or all its runs if it has none).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="write a sweep's comparison report from MLflow")
    report.add_argument("--experiment", default="posbench", help="MLflow experiment name (default: posbench)")
    report.add_argument("--sweep", default=None, help="sweep_id tag of the sweep (default: the latest sweep)")
    report.add_argument("--out", required=True, help="output directory, e.g. results/posbench/")
    report.add_argument("--target", type=float, default=None,
                        help="target val loss (nats/token) for 'steps to target'; default: the worst cell's final loss")
    report.add_argument("--tracking-uri", default=None,
                        help="MLflow store; default $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db")
    paper = commands.add_parser("paper", help="a paper preset's claim report (README.md with verdict)")
    paper.add_argument("--preset", required=True, help="conf/experiment/<preset>.yaml")
    paper.add_argument("--scale", default="toy", choices=["toy", "paper"])
    paper.add_argument("--sweep", default=None, help="sweep_id (default: the preset experiment's latest sweep)")
    paper.add_argument("--out", default=None, help="default: results/<preset>/")
    paper.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    if args.command == "paper":
        from results.paper import main as paper_main

        return paper_main(args)

    from harness.record.store import Store, resolve_tracking_uri
    from results.store import find_sweep, generate

    uri = resolve_tracking_uri(args.tracking_uri)
    client = Store.open(uri).client
    try:
        sweep = find_sweep(client, args.experiment, args.sweep)
    except LookupError as e:
        print(f"error: {e} (store: {uri})", file=sys.stderr)
        return 2
    for path in generate(client, sweep, args.out, args.target):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
