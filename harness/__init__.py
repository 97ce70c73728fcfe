"""posbench's harness: everything between a command line and a logged, comparable run.

Rooms (each says in its ``__init__`` what it owns and which rooms it may import):

  config/    building: compose, the typed schema, the one validation pass, build objects, the matrix
  data/      what the model reads: corpora, tokenizer, windows, objectives, synthetic tasks
  model/     the network and how it learns and is scored: transformer, LightningModule, evaluation
  record/    the MLflow run record: store, the run's one owner, logger, resume, checkpoints, reconcile
  sweep/     multirun: the sweep's parent run, one cell per job, the report at the end
  bench/     benchmarks (``python -m harness.bench``)

and four modules: ``main`` (the ``posbench`` command, which ``python run.py`` also is), ``train`` (the
pipeline of one run), ``cli`` (entry-point plumbing: one-line errors, ``--check``, ``--matrix``) and
``scaleout`` (DDP ranks in Hydra multiruns, batch geometry).
``errors`` and ``paths`` are the ground every room may stand on. Imports flow one way:
main → cli → sweep → train → config/record → model → data → errors/paths; ``tests/unit/test_architecture.py``
fails on any import circle.
"""
