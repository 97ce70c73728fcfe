"""Room: bench — what each positional scheme × attention cell costs, beside the libraries people use,
and whether the speed targets are met (``python -m harness.bench``, cli.py: this command's own flags, as
harness/cli.py holds ``run``'s).

Owns: measuring a step (``measure``: time, allocated memory, FLOPs, matmul peak; ``profiled``: a
scheme's own share of a step), intervals and verdicts (``stats``: order statistics of timing rounds, whose noise is
one-sided, where harness/stats.py compares seeds), the cells and peers (``cells``: a benchmark's pos × attn cell at
one shape, built to be timed; results/cells.py is a trained sweep's), the targets (``targets``), a run's
bookkeeping and its paired timing of two warm steps (``session``) and the report (``report``: the benchmark's files, as
harness/pretrained/report.py and results/report.py write their commands' own); and the GPU check, one prepared
run for a GPU lent for minutes (``python -m harness.bench.gpu``: ``gpu``, the memory estimate against the
measured peak in ``gpu_memory``, bias schemes through flex_attention in ``flex``, its report in ``gpu_report``;
results/bench_gpu/); and the smaller benchmarks, each its own command: the data loader against the model's appetite
(``loader``), every attention variant's step (``attention``), the fastest way to train several seeds on a CPU
(``seeds``), the memory estimate against a CPU step's peak (``cpu_memory``, results/bench_cpu_memory/). The peers
(x-transformers, transformers, performer-pytorch) are imported only inside ``cells``'s builders. Outside this
room only harness.main imports it (``posbench bench`` runs these commands).

May import: attention and positional (what the benchmarks time); harness.config, harness.data, harness.model
and harness.record (``internals`` assembles from them what several benchmarks share: a cell's config and model,
a step's memory estimate, random shards and their loader); and the ground.
"""
