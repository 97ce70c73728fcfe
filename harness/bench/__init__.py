"""The benchmark room: what each positional scheme × attention cell costs, beside the libraries people use,
and whether the speed targets are met. ``python -m harness.bench`` (cli.py) writes results/bench-style reports.

Owns: measuring a step (measure.py: time, allocated memory, FLOPs, matmul peak; profiled.py: a scheme's own
share of a step), paired timing (pairing.py), intervals and verdicts (stats.py), the cells and peers
(cells.py), the targets (targets.py), a run's bookkeeping (session.py) and the report (report.py).

May import: torch, the peers (x-transformers, transformers, performer-pytorch: only inside cells.py's
builders), harness.errors, and the rest of harness/ only through internals.py (config composition, the model,
instantiation, MLflow tracking, the project root). Nothing outside this room imports it.
"""
