"""README.md of a ``python -m harness.bench.gpu`` folder, from its CSVs and run.log alone (``--render``
rewrites it): tables, and the sentences that follow from the numbers (no hand-written findings)."""

from __future__ import annotations

import csv
from pathlib import Path


def _rows(folder: Path, name: str) -> list[dict[str, str]]:
    path = folder / f"{name}.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def _num(x: str | None) -> float:
    try:
        return float(x) if x not in (None, "") else float("nan")
    except ValueError:
        return float("nan")


def _f(x: str | None, spec: str, unit: str = "") -> str:
    v = _num(x)
    return "—" if v != v else f"{format(v, spec)}{unit}"


def _table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(line) + " |" for line in lines), ""]


def memory_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["## Memory: not measured in this run", ""]
    out = ["## Memory: `--check --gpu-memory`'s estimate vs the measured peak", "",
           "Estimate: `harness.config.resources.gpu_estimate`, called with what `--check --gpu-memory` passes it "
           "(the model laid out on the meta device; a test holds the two equal). Measured: "
           "`torch.cuda.max_memory_allocated()` over 20 optimizer steps (bf16-mixed autocast, the preset's AdamW, "
           "fp32 cross-entropy over every position's logits), minus what was allocated before the model. "
           "Random token ids at the paper's vocabulary size.", ""]
    lines = [[r["preset"], r["batch"], r["seq_len"], f"{int(r['vocab']):,}", f"{int(r['n_params']) / 1e6:.1f}M",
              _f(r["estimate_gib"], ".1f"), f"{_f(r['states_gib'], '.1f')} / {_f(r['activations_gib'], '.1f')} / "
              f"{_f(r['logits_gib'], '.1f')}", _f(r["measured_gib"], ".1f"), _f(r["measured_over_estimate"], ".2f"),
              _f(r["tokens_per_s"], ",.0f"), r["status"]] for r in rows]
    out += _table(["preset", "batch", "T", "vocab", "params", "estimate (GiB)", "states / activations / logits",
                   "measured (GiB)", "measured ÷ estimate", "tokens/s", "status"], lines)
    ratios = [_num(r["measured_over_estimate"]) for r in rows if r["status"] == "ok"]
    ratios = [x for x in ratios if x == x]
    if ratios:
        out += [f"Measured ÷ estimate: {min(ratios):.2f} … {max(ratios):.2f} over {len(ratios)} cells "
                f"({'the estimate is low' if max(ratios) > 1 else 'the estimate is an upper bound'} by up to "
                f"{abs(max(ratios) - 1) if max(ratios) > 1 else abs(1 - min(ratios)):.0%}).", ""]
    return out


def steps_section(rows: list[dict[str, str]], peers: list[dict[str, str]]) -> list[str]:
    out = []
    if rows:
        out += ["## Training step at d768, 12 layers, 12 heads, T = 2048 (causal)", "",
                "`harness.bench`'s cell: forward + backward with a cross-entropy loss under bf16 autocast, random "
                "byte ids (V = 258: the table is about positions and attention, not the head), median of up to 10 "
                "timed steps after 2 warm-up steps. FLOPs from `torch.utils.flop_counter`. MFU against the run's "
                "measured matmul peak and against the datasheet's dense bf16 peak.", ""]
        lines = [[r["pos"], r["attn"], r["batch"], _f(_ms(r["step_s"]), ",.1f"), _f(r["tokens_per_s"], ",.0f"),
                  _f(_tflops(r), ",.0f"), _f(r["mfu"], ".1%"), _f(r.get("mfu_datasheet"), ".1%"),
                  _f(_gib(r["peak_mem_mb"]), ".1f"), r["status"] + (f": {r['reason'][:80]}" if r["reason"] else "")]
                 for r in rows]
        out += _table(["pos", "attn", "batch", "step (ms)", "tokens/s", "TFLOP/s", "MFU (measured peak)",
                       "MFU (datasheet)", "peak (GiB)", "status"], lines)
    if peers:
        out += ["## Peers at the same shape (paired)", "",
                "posbench ÷ peer = the peer's step time ÷ posbench's: the median of ABBA rounds with its "
                "distribution-free 95 % interval (harness/bench/stats.py). Above 1: posbench is faster.", ""]
        lines = [[r["peer"], f"{r['pos']} × {r['attn']}", _f(r["peer_tokens_per_s"], ",.0f"),
                  _f(r["posbench_tokens_per_s"], ",.0f"), _f(r["posbench_over_peer"], ".2f"),
                  f"[{_f(r['low'], '.2f')}, {_f(r['high'], '.2f')}]", r["rounds"], r["note"][:120]] for r in peers]
        out += _table(["peer", "posbench cell", "peer tokens/s", "posbench tokens/s", "posbench ÷ peer",
                       "95 % interval", "rounds", "note"], lines)
    return out


def _ms(step_s: str) -> str:
    return str(_num(step_s) * 1e3)


def _gib(mb: str) -> str:
    return str(_num(mb) / 1024)


def _tflops(r: dict[str, str]) -> str:
    return str(_num(r["flops"]) / _num(r["step_s"]) / 1e12)


def flex_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["## flex_attention: not measured in this run", ""]
    out = ["## Bias schemes through flex_attention", "",
           "The scheme's bias as a `score_mod` (harness/bench/flex.py): a lookup into its own per-offset table "
           "(T5, ALiBi, KERPLE) or its (H, T, T) values (FIRE), causal block mask, `torch.compile`d. Parity: "
           "against posbench's dense path (SDPA with the additive mask), fp32, B = 1, H = 12, T = 2048, D = 64; "
           "output max |Δ| and the largest gradient error (q, k, v and the scheme's parameters) relative to the "
           "gradient's max |·|. Time: forward + backward of the attention call alone, bf16, B = 8, ÷ plain SDPA "
           "with no bias (`is_causal=True`), ABBA rounds; goal ≤ 1.1.", ""]
    lines = [[r["scheme"], _f(r.get("fp32_out_max_abs_err"), ".1e"), _f(r.get("fp32_grad_max_rel_err"), ".1e"),
              r.get("grads_compared", ""), _ratio(r, "flex"), _ratio(r, "dense"), r.get("note", "")[:160]]
             for r in rows]
    out += _table(["scheme", "out max abs err", "grad max rel err", "gradients", "flex ÷ SDPA",
                   "dense ÷ SDPA (posbench today)", "note"], lines)
    return out


def _ratio(r: dict[str, str], path: str) -> str:
    if not r.get(f"{path}_over_sdpa"):
        return "—"
    return (f"{_f(r[f'{path}_over_sdpa'], '.2f')} [{_f(r[f'{path}_low'], '.2f')}, {_f(r[f'{path}_high'], '.2f')}] "
            f"{r[f'{path}_verdict']}")


def cuda_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    out = ["## CUDA-only checks", ""]
    out += _table(["check", "result", "ok", "detail"],
                  [[r["check"], r["result"], r.get("ok", ""), r.get("detail", "")[:200]] for r in rows])
    return out


def render(folder: Path) -> Path:
    log = (folder / "run.log").read_text().splitlines() if (folder / "run.log").exists() else []
    head = ["# GPU benchmark: memory estimate, training step, peers, flex_attention", "",
            "Regenerate on a CUDA machine: `python -m harness.bench.gpu --out results/bench_gpu` "
            "(`--render` rewrites this file from the CSVs). From run.log:", "",
            *(f"- {line}" for line in log), ""]
    body = [*memory_section(_rows(folder, "memory")), *steps_section(_rows(folder, "steps"), _rows(folder, "peers")),
            *flex_section(_rows(folder, "flex")), *cuda_section(_rows(folder, "cuda"))]
    path = folder / "README.md"
    path.write_text("\n".join(head + body))
    return path
