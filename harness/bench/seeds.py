"""How to train several seeds fastest on this CPU: the measurement behind experiment=ablation's launcher.

    python -m harness.bench.seeds            # prints seed-steps per second of each way

Three ways to train S seeds of the ablation's model (conf/experiment/ablation/scale/toy.yaml: 2 layers,
width 128, 32 windows of 128 tokens, AdamW, gradients clipped per seed), each timed over the same steps after
two warm-up steps:

  one process     the seeds one after another, torch's threads = the cores (what the basic launcher does)
  processes       one process per core, one thread each, all at once (hydra/launcher=joblib)
  stacked (vmap)  one process, the S models' weights stacked and trained by one torch.func.vmap'd forward
                  and backward (the batched-models idea); per-seed clipping as above

pos=none for all three: RoPE's rotation is an autograd.Function without a vmap rule, and the scheme changes
little of a step's time. Rounds alternate between the ways so drift on the machine hits each alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from harness.bench.internals import build_transformer
from harness.bench.measure import timed_steps
from harness.errors import said_refusal

STEPS, WARMUP, ROUNDS = 8, 2, 3
B, T, V = 32, 128, 258


def _models(seeds: int):
    overrides = [
        "pos=none",
        "attn=softmax",
        "model.n_layers=2",
        "model.d_model=128",
        "model.n_heads=4",
        "model.d_ff=512",
        "model.dropout=0.1",
        f"data.seq_len={T}",
    ]
    out = []
    for s in range(seeds):
        torch.manual_seed(s)
        out.append(build_transformer(overrides, V, T, False).train())
    return out


def _loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def _sequential_step(seeds: int):
    models = _models(seeds)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    x, y = torch.randint(0, V, (seeds, B, T)), torch.randint(0, V, (seeds, B, T))

    def step():
        for m, opt, xs, ys in zip(models, opts, x, y, strict=True):
            opt.zero_grad()
            _loss(m(xs), ys).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()

    return step


def _stacked_step(seeds: int):
    models = _models(seeds)
    params, _ = stack_module_state(models)  # each weight (S, ...)
    params = {k: v.detach().requires_grad_() for k, v in params.items()}
    buffers, base = dict(models[0].named_buffers()), models[0]  # buffers are equal across seeds: not stacked
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3)
    x, y = torch.randint(0, V, (seeds, B, T)), torch.randint(0, V, (seeds, B, T))
    losses = vmap(
        lambda p, b, xs, ys: _loss(functional_call(base, (p, b), (xs,)), ys),
        in_dims=(0, None, 0, 0),
        randomness="different",
    )  # dropout draws differ per seed, as in separate runs

    def step():
        opt.zero_grad()
        losses(params, buffers, x, y).sum().backward()
        norms = torch.stack([p.grad.flatten(1).pow(2).sum(1) for p in params.values()]).sum(0).sqrt()  # (S,)
        scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        for p in params.values():
            p.grad.mul_(scale.view(-1, *[1] * (p.dim() - 1)))
        opt.step()

    return step


def timed(way: str, seeds: int, threads: int) -> float:
    """Seconds per step of ``seeds`` seeds, in this process."""
    torch.set_num_threads(threads)
    step = (_stacked_step if way == "stacked" else _sequential_step)(seeds)
    return statistics.fmean(timed_steps(step, "cpu", WARMUP, STEPS))


def _in_child(way: str, seeds: int, threads: int) -> subprocess.Popen:
    code = f"from harness.bench.seeds import timed; print(timed({way!r}, {seeds}, {threads}))"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _seed_steps_per_s(way: str, cores: int, seeds: int) -> float:
    if way == "processes":  # one seed per process, `cores` processes at once: their rates add up
        children = [_in_child("one", 1, 1) for _ in range(cores)]
        return sum(1 / float(c.communicate()[0]) for c in children)
    return seeds / float(_in_child(way, seeds, cores).communicate()[0])


def main(argv: list[str] | None = None) -> int:
    if argv:
        return said_refusal(f"python -m harness.bench.seeds takes no arguments (got {' '.join(argv)})")
    cores, seeds = os.cpu_count() or 1, 3
    ways = ["one", "processes", "stacked"]
    rates: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(ROUNDS):
        for way in ways if r % 2 == 0 else ways[::-1]:
            rates[way].append(_seed_steps_per_s(way, cores, seeds))
    base = statistics.median(rates["one"])
    print(
        f"{cores} cores, {seeds} seeds, {ROUNDS} rounds; seed-steps per second (median, min … max), "
        "ratio to one process"
    )
    names = {"one": "one process", "processes": f"{cores} processes × 1 thread", "stacked": f"stacked (vmap, {seeds})"}
    for way in ways:
        m = statistics.median(rates[way])
        print(f"  {names[way]:<26} {m:6.2f}  ({min(rates[way]):.2f} … {max(rates[way]):.2f})  {m / base:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
