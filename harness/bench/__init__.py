"""Room: bench — what each positional scheme × attention cell costs, beside the libraries people use,
and whether the speed targets are met (``python -m harness.bench``, cli.py).

Owns: measuring a step (``measure``: time, allocated memory, FLOPs, matmul peak; ``profiled``: a
scheme's own share of a step), paired timing (``pairing``), intervals and verdicts (``stats``), the
cells and peers (``cells``), the targets (``targets``), a run's bookkeeping (``session``) and the
report (``report``). The peers (x-transformers, transformers, performer-pytorch) are imported only
inside ``cells``'s builders. Nothing outside this room imports it.

May import: harness.config, harness.model and harness.record, all through
``internals`` alone (so a move elsewhere in harness/ is fixed in that one file), and the ground.
"""
