"""posbench's harness: everything between a command line and a logged, comparable run.

Rooms (each says in its ``__init__`` what it owns and which rooms it may import):

  config/      the edge: load → RunSpec → check → build, the option catalogue, the matrix
  data/        what the model reads: corpora, tokenizers, windows, objectives, synthetic tasks, shards
  model/       the network and how it learns and is scored: transformer, LightningModule, evaluation
  record/      the MLflow run record: store, the run's one owner, logger, resume, checkpoints
  sweep/       multirun: the sweep's parent run, one cell per job, the report at the end, tuning
  pretrained/  RoPE scalings on a Hugging Face causal LM's own weights (``posbench hf-eval``), export
  bench/       benchmarks (``python -m harness.bench``)

and the modules beside them: ``main`` (the ``posbench`` command, which ``python run.py`` also is, and the Hydra
app that trains), ``cli`` (``run`` and ``check``: this command's own flags, as harness/bench/cli.py holds the
benchmark's), ``train`` (the pipeline of one run) and ``scaleout`` (DDP ranks, batch geometry); the ground every
room may stand on: ``errors`` (one-line errors), ``ranges`` (ranges declared in annotations), ``paths``,
``allocator`` (malloc settings), ``signals`` (SIGTERM and Ctrl-C), ``extras`` (optional packages), ``integrity``
(files and records with their sha256), ``markdown`` (the reports' markdown tables), ``stats`` (the statistics of a
comparison between seeds of arms: reports and hf-eval verdicts; timing rounds have their own,
harness/bench/stats.py) and ``sequential`` (a family of comparisons decided look by look: group-sequential
boundaries, Holm, equivalence, futility).
Imports flow one way: main → cli → config → model → data → the ground, with sweep → train → config/record;
``tests/unit/test_architecture.py`` fails on any import circle.
"""
