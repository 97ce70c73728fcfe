"""Benchmarks: what each pos × attn cell costs, side by side with the libraries people use.

    python -m harness.bench                      # default grid, peers at T=512, report to results/bench/
    python -m harness.bench --pos rope --attn softmax,linear --lengths 1024,4096 --no-peers

Per cell (one process, one thread pool, same inputs):
  step time   median of up to ``repeats`` forward+backward passes (loss = cross-entropy), fewer once
              they add up to ``--cell-s`` seconds (at least one), after ``warmup`` more; the
              FLOP-counting step runs first and already warms every kernel and buffer up
  tokens/s    batch · T / step time; batch = tokens_per_step / T, so every length does equal work
  memory      peak RSS increase during one step, sampled every 0.5 ms, after glibc malloc_trim
              (CPU); torch.cuda.max_memory_allocated (GPU)
  FLOPs       counted by torch.utils.flop_counter.FlopCounterMode over one forward+backward:
              matmul/bmm/SDPA FLOPs from the ops' shapes (analytic per op); elementwise and FFT
              work is not counted, so kernelized and FFT paths are credited with their GEMMs only
  MFU         FLOPs / step time / peak, peak = a large fp32 matmul timed in the same run (CPU) or
              the bf16 matmul peak (GPU)
Results go to MLflow (experiment ``bench``, one run per cell) and to ``--out`` as a table and plots.

May import: harness.config, harness.model, harness.record, results (its report), and the ground.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.paths import ROOT  # noqa: E402


@dataclass
class Result:
    name: str  # "posbench" or the peer's name
    pos: str
    attn: str
    seq_len: int
    batch: int
    step_s: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_mem_mb: float = float("nan")
    flops: float = float("nan")
    mfu: float = float("nan")
    repeats: int = 0  # timed steps behind step_s
    status: str = "ok"  # ok | refused | error
    reason: str = ""
    extra: dict = field(default_factory=dict)


# --- measurement --------------------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed pages back so the next delta is honest
    except OSError:
        pass


class PeakRss:
    """Samples RSS in a thread (torch ops release the GIL) and keeps the peak."""

    def __enter__(self):
        _trim()
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def matmul_peak_flops(device: str = "cpu", sizes: tuple[int, ...] = (2048, 4096),
                      seconds: float = 1.5) -> tuple[float, int]:
    """Best FLOP/s of square n×n @ n×n matmuls (fp32 on CPU, bf16 on GPU), timed here and now.

    Several sizes, best of all: a peak that a training step's own GEMMs beat would flatter MFU.
    Returns (FLOP/s, the n that reached it)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    best, best_n = 0.0, sizes[0]
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up: first call allocates and picks a kernel
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            _sync(device)
            t0 = time.perf_counter()
            a @ b
            _sync(device)
            flops = 2 * n**3 / (time.perf_counter() - t0)
            if flops > best:
                best, best_n = flops, n
    return best, best_n


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _register_cpu_sdpa_flops() -> None:
    """torch's FlopCounterMode knows the CUDA SDPA kernels but not the CPU flash kernel that
    F.scaled_dot_product_attention dispatches to here; without this, attention counts 0 FLOPs."""
    from torch.utils import flop_counter as fc

    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd in fc.flop_registry:
        return

    @fc.register_flop_formula(fwd)
    def _fwd(query, key, value, *args, **kwargs) -> int:
        return fc.sdpa_flop_count(query, key, value)

    @fc.register_flop_formula(bwd)
    def _bwd(grad_out, query, key, value, *args, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)


def count_flops(step: Callable[[], None]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def measure(step: Callable[[], None], tokens: int, device: str, warmup: int, repeats: int,
            cell_s: float = float("inf")) -> dict:
    for _ in range(warmup):
        step()
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with PeakRss() as rss:
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - t0)
            if sum(times) >= cell_s:  # long cells: fewer repeats, so the default grid fits its time budget
                break
    mem = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else rss.delta_mb
    step_s = statistics.median(times)
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "peak_mem_mb": mem, "repeats": len(times)}


def make_step(forward: Callable[[torch.Tensor], torch.Tensor], module: torch.nn.Module, ids: torch.Tensor,
              autocast: bool) -> Callable[[], None]:
    """One forward+backward with a cross-entropy loss; grads are dropped afterwards."""
    labels = ids.roll(-1, dims=1)

    def step():
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = forward(ids)
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).backward()
        module.zero_grad(set_to_none=True)

    return step


# --- what is measured ---------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """One cell's model: posbench's config groups plus the shape peers are built with."""

    pos: str
    attn: str
    seq_len: int
    batch: int
    model: str = "small"
    causal: bool = False
    attn_overrides: tuple[str, ...] = ()


def _compose(spec: Spec):
    from harness.config.compose import compose

    return compose([f"pos={spec.pos}", f"attn={spec.attn}", f"model={spec.model}", "model.dropout=0.0",
                    f"data.seq_len={spec.seq_len}", *spec.attn_overrides])


def build_posbench(spec: Spec):
    from harness.config.instantiate import instantiate
    from harness.model.transformer import Transformer

    cfg = _compose(spec)
    model = Transformer(instantiate(cfg.model), 258, spec.seq_len, spec.causal,
                        pos=instantiate(cfg.pos), attn=instantiate(cfg.attn))
    return model, model


def build_peer(peer: str, spec: Spec):
    """The same shape (layers, width, heads, d_ff, vocab, length) in another library.

    Peers are optional (``pip install -e .[bench]``); the harness itself never imports them.
    """
    m = _compose(spec).model
    shape = dict(L=m.n_layers, C=m.d_model, H=m.n_heads, F=m.d_ff, V=258, T=spec.seq_len)
    return PEERS[peer][1](spec.causal, **shape)


def _x_transformers(kind):
    def build(causal, L, C, H, F, V, T):
        from x_transformers import Decoder, Encoder, TransformerWrapper

        options = {kind: True, **({"rotary_emb_dim": C // H} if kind == "rotary_pos_emb" else {})}  # full rotary, as ours
        layers = (Decoder if causal else Encoder)(dim=C, depth=L, heads=H, attn_dim_head=C // H,
                                                 ff_mult=F // C, **options)
        model = TransformerWrapper(num_tokens=V, max_seq_len=T, attn_layers=layers, use_abs_pos_emb=False,
                                   tie_embedding=True)
        return model, model
    return build


def _hf(kind):
    def build(causal, L, C, H, F, V, T):
        import transformers

        common = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
                      intermediate_size=F, max_position_embeddings=T, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, is_decoder=causal)
        if kind == "roformer":
            config = transformers.RoFormerConfig(embedding_size=C, **common)
            cls = transformers.RoFormerForCausalLM if causal else transformers.RoFormerForMaskedLM
        else:
            config = transformers.BertConfig(**common)
            cls = transformers.BertLMHeadModel if causal else transformers.BertForMaskedLM
        model = cls(config)
        return model, lambda ids: model(input_ids=ids).logits
    return build


def _performer_lm(causal, L, C, H, F, V, T):
    from performer_pytorch import PerformerLM

    model = PerformerLM(num_tokens=V, max_seq_len=T, dim=C, depth=L, heads=H, dim_head=C // H, causal=causal,
                        ff_mult=F // C, rotary_position_emb=True, tie_embed=True)
    return model, model


# peer name -> (the posbench cell it is compared with, builder)
PEERS: dict[str, tuple[tuple[str, str], Callable]] = {
    "x-transformers rotary": (("rope", "softmax"), _x_transformers("rotary_pos_emb")),
    "x-transformers T5 bias": (("t5", "softmax"), _x_transformers("rel_pos_bias")),
    "x-transformers ALiBi": (("alibi", "softmax"), _x_transformers("alibi_pos_bias")),
    "HF RoFormer": (("rope", "softmax"), _hf("roformer")),
    "HF BERT": (("learned", "softmax"), _hf("bert")),
    "performer-pytorch PerformerLM": (("rope", "performer"), _performer_lm),
}


def training_step(spec: Spec, build: Callable, device: str) -> Callable[[], None]:
    """Build a cell's model on ``device`` with random token ids: one call = one training step."""
    module, forward = build(spec)
    module.to(device).train()
    ids = torch.randint(256, (spec.batch, spec.seq_len), device=device)
    return make_step(forward, module, ids, autocast=device == "cuda")


def run_cell(name: str, spec: Spec, build: Callable, device: str, peak: float, warmup: int,
             repeats: int, cell_s: float = float("inf")) -> Result:
    from harness.errors import ConfigError

    result = Result(name, spec.pos, spec.attn, spec.seq_len, spec.batch)
    try:
        step = training_step(spec, build, device)
        result.flops = count_flops(step)
        for key, value in measure(step, spec.batch * spec.seq_len, device, warmup, repeats, cell_s).items():
            setattr(result, key, value)
        result.mfu = result.flops / result.step_s / peak
    except ConfigError as e:
        result.status, result.reason = "refused", str(e)
    except Exception as e:  # a broken cell is recorded, the grid goes on
        result.status, result.reason = "error", f"{type(e).__name__}: {e}"[:300]
    finally:
        step = None  # noqa: F841 — free the model before the next cell's memory baseline
        _trim()
    return result


def unique(results: list[Result]) -> list[Result]:
    """Each measured cell once, in first-seen order (a shared cell appears in grid, peers and targets)."""
    return list({id(r): r for r in results}.values())


def available(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


# --- the targets: each is a ratio of cells measured in this run ---------------

@dataclass(frozen=True)
class Target:
    label: str
    goal: str
    cells: dict[str, Spec]
    value: Callable[[dict[str, Result], float | None], float]  # (cells, paired ratio) -> measured value
    ok: Callable[[float], bool]
    paired: tuple[str, str] | None = None  # (numerator, denominator) cells: value from interleaved timings
    round_s: float = 20.0  # time for the paired rounds (3 to 7 of them)


def _targets(tokens: int) -> list[Target]:
    wide = dict(model="d512", seq_len=512, batch=tokens // 512)
    local = ("attn.window=256",)
    return [
        Target("RoPE overhead vs pos=none (d512, T=512)", "≤ 2 %",
               {"none": Spec("none", "softmax", **wide), "rope": Spec("rope", "softmax", **wide)},
               lambda r, ratio: ratio - 1, lambda v: v <= 0.02, paired=("rope", "none"), round_s=60.0),
        Target("MFU of a training step (d512, T=512, none+softmax)", "≥ 50 %",
               {"none": Spec("none", "softmax", **wide)}, lambda r, _: r["none"].mfu, lambda v: v >= 0.5),
        *[Target(f"{a}: step(16k) / step(1k), batch 1", "≤ 20",
                 {"1k": Spec("none", a, 1024, 1), "16k": Spec("none", a, 16384, 1)},
                 lambda r, ratio: ratio, lambda v: v <= 20, paired=("16k", "1k")) for a in ("performer", "linear")],
        Target("linear: causal / bidirectional step at 16k", "≤ 2",
               {"bi": Spec("none", "linear", 16384, 1), "causal": Spec("none", "linear", 16384, 1, causal=True)},
               lambda r, ratio: ratio, lambda v: v <= 2, paired=("causal", "bi")),
        Target("local (w=256): peak memory 16k / 8k", "≤ 1.5",
               {"8k": Spec("none", "local", 8192, 1, attn_overrides=local),
                "16k": Spec("none", "local", 16384, 1, attn_overrides=local)},
               lambda r, _: r["16k"].peak_mem_mb / r["8k"].peak_mem_mb, lambda v: v <= 1.5),
        Target("local (w=256) speed-up over full softmax at 16k (a lower bound for band-masked softmax)", "≥ 5",
               {"local": Spec("none", "local", 16384, 1, attn_overrides=local),
                "softmax": Spec("none", "softmax", 16384, 1)},
               lambda r, _: r["softmax"].step_s / r["local"].step_s, lambda v: v >= 5),
        Target("T5 bias / plain softmax step (T=512)", "≤ 1.3",
               {"t5": Spec("t5", "softmax", 512, tokens // 512), "none": Spec("none", "softmax", 512, tokens // 512)},
               lambda r, ratio: ratio, lambda v: v <= 1.3, paired=("t5", "none")),
        Target("Toeplitz-FFT T5 on Performer / plain Performer (T=4096)", "≤ 3",
               {"t5": Spec("t5", "performer", 4096, max(1, tokens // 4096)),
                "none": Spec("none", "performer", 4096, max(1, tokens // 4096))},
               lambda r, ratio: ratio, lambda v: v <= 3, paired=("t5", "none")),
    ]


def paired_ratio(num: Spec, den: Spec, device: str, round_s: float = 20.0,
                 builders: tuple[Callable, Callable] | None = None) -> tuple[float, list[float]]:
    """Median of step(num)/step(den) over rounds that time the two models back to back, in
    alternating order (ABBA), so drift in the machine's speed (other load, frequency) cancels
    instead of landing on one side. Rounds: as many as fit ``round_s`` seconds, between 3 and 7.
    ``builders``: how to build each side (default: posbench for both; a peer's builder for peers)."""
    steps = [training_step(spec, build, device)
             for spec, build in zip((num, den), builders or (build_posbench, build_posbench))]

    def timed(step) -> float:
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        return time.perf_counter() - t0

    for step in steps:  # first call: allocator, lazy init, kernel selection
        step()
    per_round = timed(steps[0]) + timed(steps[1])  # a second warm-up, and the size of one round
    ratios = []
    for i in range(max(3, min(7, int(round_s / per_round)))):
        if i % 2 == 0:
            t_num, t_den = timed(steps[0]), timed(steps[1])
        else:
            t_den, t_num = timed(steps[1]), timed(steps[0])
        ratios.append(t_num / t_den)
    steps = None  # noqa: F841
    _trim()
    return statistics.median(ratios), ratios


# --- orchestration --------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.split("\n\n")[0])
    # the grid's default is pos=none, so the default run fits in 10 minutes on 2 cores; RoPE's and T5's cost
    # are measured by the targets (and the peers) against pos=none. --pos none,rope,t5 for the full grid.
    p.add_argument("--pos", default="none", help="comma list of conf/pos options")
    p.add_argument("--attn", default="all", help="comma list of conf/attn options, or 'all'")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step; batch = tokens / length")
    p.add_argument("--model", default="small", help="conf/model preset")
    p.add_argument("--warmup", type=int, default=0, help="untimed steps after the (untimed) FLOP-counting step")
    p.add_argument("--repeats", type=int, default=3, help="most timed steps per cell")
    p.add_argument("--cell-s", type=float, default=5.0,
                   help="stop timing a cell once its timed steps add up to this many seconds (at least one)")
    p.add_argument("--budget-s", type=float, default=12.0,
                   help="skip longer lengths of a cell once one step takes longer than this")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--no-targets", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(ROOT / "results" / "bench"))
    p.add_argument("--tracking-uri", default=None, help="default: as run.py ($MLFLOW_TRACKING_URI or ./mlflow.db)")
    args = p.parse_args(argv)

    pos_all, attn_all = available("pos"), available("attn")
    poses = [x for x in args.pos.split(",") if x in pos_all]
    attns = attn_all if args.attn == "all" else [x for x in args.attn.split(",") if x in attn_all]
    missing = sorted(set(args.pos.split(",")) - set(pos_all)) + (
        [] if args.attn == "all" else sorted(set(args.attn.split(",")) - set(attn_all)))
    if missing:
        print(f"note: not in conf/: {', '.join(missing)} (skipped)")
    lengths = [int(x) for x in args.lengths.split(",")]
    started = time.perf_counter()
    peak, peak_n = matmul_peak_flops(args.device, (4096, 8192) if args.device == "cuda" else (2048, 4096))
    print(f"peak {'bf16' if args.device == 'cuda' else 'fp32'} matmul: {peak / 1e9:,.1f} GFLOP/s at n={peak_n}; "
          f"{torch.get_num_threads()} threads")

    measured: dict[Spec, Result] = {}  # a posbench cell the grid, a peer and a target share is measured once

    def run(name, spec, build):
        if name == "posbench" and spec in measured:
            return measured[spec]
        r = run_cell(name, spec, build, args.device, peak, args.warmup, args.repeats, args.cell_s)
        if name == "posbench":
            measured[spec] = r
        line = (f"{r.step_s * 1e3:9.1f} ms {r.tokens_per_s:10,.0f} tok/s {r.peak_mem_mb:8.1f} MB "
                f"MFU {r.mfu:6.1%}") if r.status == "ok" else f"{r.status}: {r.reason[:90]}"
        print(f"  {name:30s} {spec.pos:>14s} {spec.attn:>9s} T={spec.seq_len:<6d} B={spec.batch:<3d} {line}",
              flush=True)
        return r

    grid: list[Result] = []
    for pos in poses:
        for attn in attns:
            for T in lengths:
                spec = Spec(pos, attn, T, max(1, args.tokens // T), args.model)
                r = run("posbench", spec, build_posbench)
                grid.append(r)
                if r.status != "ok" or r.step_s > args.budget_s:
                    for T2 in lengths[lengths.index(T) + 1:]:
                        grid.append(Result("posbench", pos, attn, T2, max(1, args.tokens // T2), status="skipped",
                                           reason="a shorter length already failed or exceeded --budget-s"))
                    break

    peers: list[tuple[Result, Result, float | None, list[float]]] = []
    if not args.no_peers:
        T = lengths[0]
        for peer, ((pos, attn), _) in PEERS.items():
            if pos not in pos_all or attn not in attn_all:
                continue
            spec = Spec(pos, attn, T, max(1, args.tokens // T), args.model)
            ours = run("posbench", spec, build_posbench)
            build = lambda s, peer=peer: build_peer(peer, s)  # noqa: E731
            theirs = run(peer, spec, build)
            ratio, ratios = None, []
            if ours.status == theirs.status == "ok":  # posbench ÷ peer tokens/s = peer step / posbench step
                ratio, ratios = paired_ratio(spec, spec, args.device, round_s=10.0, builders=(build, build_posbench))
                print(f"  paired {peer} / posbench: " + ", ".join(f"{x:.3f}" for x in ratios), flush=True)
            peers.append((ours, theirs, ratio, ratios))

    targets: list[tuple[Target, dict[str, Result], float | None, list[float]]] = []
    if not args.no_targets:
        for target in _targets(args.tokens):
            if any(s.pos not in pos_all or s.attn not in attn_all for s in target.cells.values()):
                continue
            cells = {k: run("posbench", s, build_posbench) for k, s in target.cells.items()}
            ok = all(c.status == "ok" for c in cells.values())
            ratio, ratios = None, []
            if ok and target.paired:
                num, den = target.paired
                ratio, ratios = paired_ratio(target.cells[num], target.cells[den], args.device, target.round_s)
                print(f"  paired {num}/{den}: " + ", ".join(f"{x:.3f}" for x in ratios), flush=True)
            targets.append((target, cells, target.value(cells, ratio) if ok else None, ratios))

    seconds = time.perf_counter() - started
    from results.bench_report import write_report

    write_report(Path(args.out), grid, peers, targets, peak=peak, peak_n=peak_n, device=args.device, seconds=seconds,
                 command=" ".join(["python -m harness.bench", *(argv if argv is not None else sys.argv[1:])]))
    _log_to_mlflow(args.tracking_uri, unique(grid + [r for pair in peers for r in pair[:2]] +
                                             [c for _, cells, *_ in targets for c in cells.values()]), peak, args.device)
    print(f"done in {seconds:.0f} s; report in {args.out}")
    return 0


def _log_to_mlflow(uri: str | None, results: list[Result], peak: float, device: str) -> None:
    """One MLflow run per measured cell in experiment ``bench``, tagged with a shared bench_id."""
    import uuid

    from mlflow.entities import Metric

    from harness.record.run import TrackedRun, git_sha
    from harness.record.store import resolve_tracking_uri

    uri, bench_id, now = resolve_tracking_uri(uri), uuid.uuid4().hex[:12], int(time.time() * 1000)
    for r in results:
        if r.status == "skipped":
            continue
        tags = {"kind": "peer" if r.name != "posbench" else "posbench", "impl": r.name, "pos": r.pos,
                "attn": r.attn, "bench_id": bench_id, "git_sha": git_sha(), "device": device, "status": r.status}
        params = {"seq_len": str(r.seq_len), "batch": str(r.batch), "peak_flops": f"{peak:.4g}",
                  "reason": r.reason[:500]}
        run = TrackedRun(uri, "bench", f"{r.name} pos={r.pos} attn={r.attn} T={r.seq_len}")
        with run.open(tags, params):
            metrics = {k: v for k, v in asdict(r).items() if isinstance(v, float) and v == v}
            run.log_metrics(Metric(k, v, now, 0) for k, v in metrics.items())


if __name__ == "__main__":
    sys.exit(main())
