"""Room: bench — what each positional scheme × attention cell costs, beside the libraries people use,
and whether the speed targets are met (``python -m harness.bench``, cli.py).

Owns: measuring a step (``measure``: time, allocated memory, FLOPs, matmul peak; ``profiled``: a
scheme's own share of a step), paired timing (``pairing``), intervals and verdicts (``stats``), the
cells and peers (``cells``), the targets (``targets``), a run's bookkeeping (``session``) and the
report (``report``); and the GPU check, one prepared run for a GPU lent for minutes (``python -m
harness.bench.gpu``: ``gpu``, the memory estimate against the measured peak in ``gpu_memory``, bias schemes
through flex_attention in ``flex``, its report in ``gpu_report``; results/bench_gpu/); and the smaller
benchmarks, each its own command: the data loader against the model's appetite (``loader``), every attention
variant's step (``attention``), the fastest way to train several seeds on a CPU (``seeds``). The peers
(x-transformers, transformers, performer-pytorch) are imported only inside ``cells``'s builders. Nothing
outside this room imports it.

May import: attention and positional (what the benchmarks time); harness.config, harness.data, harness.model
and harness.record through ``internals`` alone (so a move elsewhere in harness/ is fixed in that one file);
and the ground.
"""
