"""Room: sweeps — a Hydra multirun as one MLflow parent run with a child per cell.

Owns: the Hydra callback that owns the parent run and writes the report at the end (``callback``),
what each job does with its cell (``cell``: train, adopt a finished run, or record a refusal), and the two
sweepers: posbench's default, Hydra's basic sweeper plus seeds in stages until each comparison is decided
(``stages``, ``report.seeds=auto``), and the tuning sweeper that gives every grid cell its own Optuna study
(``tune``, ``experiment=tune_lr``: the sweep that runs the trials, where results/tune.py reads them back into
best.json).

May import: harness.train, harness.config (a cell's RunSpec), harness.record, harness.scaleout, results (the
end-of-sweep report), and the ground (harness.sequential decides the looks).
"""
