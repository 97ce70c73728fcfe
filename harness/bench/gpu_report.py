"""README.md of a ``python -m harness.bench.gpu`` folder, from its CSVs and run.log alone (``--render``
rewrites it): tables, and the sentences that follow from the numbers (no hand-written findings)."""

from __future__ import annotations

import csv
from pathlib import Path

from harness.markdown import table


def _rows(folder: Path, name: str) -> list[dict[str, str]]:
    path = folder / f"{name}.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def _num(x: str | float | None) -> float:
    """A CSV cell as a number: an empty cell (a value the section did not measure) is nan."""
    return float(x) if x not in (None, "") else float("nan")


def _f(x: str | float | None, spec: str) -> str:
    v = _num(x)
    return "—" if v != v else format(v, spec)


def _memory_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["## Memory: not measured in this run", ""]
    now = [_estimate_now(r) for r in rows]
    lines = [
        [
            r["preset"],
            r["batch"],
            r["seq_len"],
            f"{int(r['vocab']):,}",
            f"{int(r['n_params']) / 1e6:.1f}M",
            _f(r["estimate_gib"], ".1f"),
            f"{_f(r['states_gib'], '.1f')} / {_f(r['activations_gib'], '.1f')} / {_f(r['logits_gib'], '.1f')}",
            _f(r["measured_gib"], ".1f"),
            _f(r["measured_over_estimate"], ".2f"),
            f"{e:.1f}",
            f"{_num(r['measured_gib']) / e:.2f}",
            _f(r["tokens_per_s"], ",.0f"),
            r["status"],
        ]
        for r, e in zip(rows, now, strict=True)
    ]
    return [
        "## Memory: `--check --gpu-memory`'s estimate vs the measured peak",
        "",
        "Estimate: `harness.config.estimates.gpu_estimate`, called with what `--check --gpu-memory` passes it "
        "(the model laid out on the meta device; a test holds the two equal). Measured: "
        "`torch.cuda.max_memory_allocated()` over 20 optimizer steps (bf16-mixed autocast, the preset's AdamW, "
        "fp32 cross-entropy over every position's logits), minus what was allocated before the model. "
        "Random token ids at the paper's vocabulary size.",
        "",
        *table(
            [
                "preset",
                "batch",
                "T",
                "vocab",
                "params",
                "estimate (GiB)",
                "states / activations / logits",
                "measured (GiB)",
                "measured ÷ estimate",
                "estimate now (GiB)",
                "measured ÷ estimate now",
                "tokens/s",
                "status",
            ],
            lines,
        ),
        "",
        _spread("When measured", [_num(r["measured_over_estimate"]) for r in rows if r["status"] == "ok"]),
        _spread(
            "At this commit",
            [_num(r["measured_gib"]) / e for r, e in zip(rows, now, strict=True) if r["status"] == "ok"],
        ),
        "",
    ]


def _estimate_now(row: dict[str, str]) -> float:
    """The estimate ``--check --gpu-memory`` gives for the row's cell at the code's current commit (GiB)."""
    from harness.bench.gpu_memory import MEMORY_CELLS, estimate

    cell = next(c for c in MEMORY_CELLS if c.preset == row["preset"] and c.pos == row["pos"])
    return estimate(cell, int(row["batch"]))[1].total / 2**30


def _spread(when: str, ratios: list[float]) -> str:
    ratios = [x for x in ratios if x == x]
    if not ratios:
        return f"{when}: nothing measured."
    low, high = min(ratios), max(ratios)
    side = (
        f"the estimate is low by up to {high - 1:.0%}"
        if high > 1
        else f"the estimate is above the peak by {1 / high - 1:.0%} … {1 / low - 1:.0%}"
    )
    return f"{when}: measured ÷ estimate {low:.2f} … {high:.2f} over {len(ratios)} cells ({side}).  "


def _steps_section(rows: list[dict[str, str]], peers: list[dict[str, str]]) -> list[str]:
    out = []
    if rows:
        lines = [
            [
                r["pos"],
                r["attn"],
                r["batch"],
                _f(_num(r["step_s"]) * 1e3, ",.1f"),
                _f(r["tokens_per_s"], ",.0f"),
                _f(_num(r["flops"]) / _num(r["step_s"]) / 1e12, ",.0f"),
                _f(r["mfu"], ".1%"),
                _f(r.get("mfu_datasheet"), ".1%"),
                _f(_num(r["peak_mem_mb"]) / 1024, ".1f"),
                r["status"] + (f": {r['reason'][:80]}" if r["reason"] else ""),
            ]
            for r in rows
        ]
        out += [
            "## Training step at d768, 12 layers, 12 heads, T = 2048 (causal)",
            "",
            "`harness.bench`'s cell: forward + backward with a cross-entropy loss under bf16 autocast, random "
            "byte ids (V = 258: the table is about positions and attention, not the head), median of up to 10 "
            "timed steps after 2 warm-up steps. FLOPs from `torch.utils.flop_counter`. MFU against the run's "
            "measured matmul peak and against the datasheet's dense bf16 peak.",
            "",
            *table(
                [
                    "pos",
                    "attn",
                    "batch",
                    "step (ms)",
                    "tokens/s",
                    "TFLOP/s",
                    "MFU (measured peak)",
                    "MFU (datasheet)",
                    "peak (GiB)",
                    "status",
                ],
                lines,
            ),
            "",
        ]
    if peers:
        lines = [
            [
                r["peer"],
                f"{r['pos']} × {r['attn']}",
                _f(r["peer_tokens_per_s"], ",.0f"),
                _f(r["posbench_tokens_per_s"], ",.0f"),
                _f(r["posbench_over_peer"], ".2f"),
                f"[{_f(r['low'], '.2f')}, {_f(r['high'], '.2f')}]",
                r["rounds"],
                r["note"][:120],
            ]
            for r in peers
        ]
        out += [
            "## Peers at the same shape (paired)",
            "",
            "posbench ÷ peer = the peer's step time ÷ posbench's: the median of ABBA rounds with its "
            "distribution-free 95 % interval (harness/bench/stats.py). Above 1: posbench is faster.",
            "",
            *table(
                [
                    "peer",
                    "posbench cell",
                    "peer tokens/s",
                    "posbench tokens/s",
                    "posbench ÷ peer",
                    "95 % interval",
                    "rounds",
                    "note",
                ],
                lines,
            ),
            "",
        ]
    return out


def _flex_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["## flex_attention: not measured in this run", ""]
    lines = [
        [
            r["scheme"],
            _f(r.get("fp32_out_max_abs_err"), ".1e"),
            r.get("grad_errors", ""),
            _ratio(r, "flex"),
            _ratio(r, "flex_plain"),
            _ratio(r, "dense"),
            r.get("kernel_options", ""),
            r.get("note", "")[:160],
        ]
        for r in rows
    ]
    out = [
        "## Bias schemes through flex_attention",
        "",
        "The scheme's bias as a `score_mod` (harness/bench/flex.py): a lookup into its own per-offset table "
        "(T5, ALiBi, KERPLE) or its (H, T, T) values (FIRE), causal block mask, `torch.compile`d. Parity: "
        "against posbench's dense path (SDPA with the additive mask), fp32, B = 1, H = 12, T = 2048, D = 64; "
        "output max |Δ| and the largest gradient error (q, k, v and the scheme's parameters) relative to the "
        "gradient's max |·|. Time: forward + backward of the attention call alone, bf16, B = 8, ÷ plain SDPA "
        "with no bias (`is_causal=True`), ABBA rounds; goal ≤ 1.1.",
        "",
        *table(
            [
                "scheme",
                "out max abs err",
                "gradient rel errors",
                "flex ÷ SDPA",
                "flex, no bias ÷ SDPA",
                "dense ÷ SDPA (posbench today)",
                "flex tiles",
                "note",
            ],
            lines,
        ),
        "",
    ]
    failures = sorted({r["kernel_failures"] for r in rows if r.get("kernel_failures")})
    out += [f"Tiles that did not compile: {f[:300]}" for f in failures] + [""] if failures else []
    return [
        *out,
        "FIRE's `mlps.0.2.bias` (the MLP's output bias) adds one constant per head to every logit of a row; "
        "softmax does not change under such a shift, so its exact gradient is 0 and both paths return rounding "
        "noise there: its relative error is not a parity figure.",
        "",
    ]


def _ratio(r: dict[str, str], path: str) -> str:
    if not r.get(f"{path}_over_sdpa"):
        return "—"
    return (
        f"{_f(r[f'{path}_over_sdpa'], '.2f')} [{_f(r[f'{path}_low'], '.2f')}, {_f(r[f'{path}_high'], '.2f')}] "
        f"{r[f'{path}_verdict']}"
    )


def _cuda_section(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return []
    return [
        "## CUDA-only checks",
        "",
        *table(
            ["check", "result", "ok", "detail"],
            [[r["check"], r["result"], r.get("ok", ""), r.get("detail", "")[:200]] for r in rows],
        ),
        "",
    ]


def render(folder: Path, check: bool = False) -> None:
    """README.md from the folder's CSVs and its run logs (run.log, then run2.log … of later runs of some
    sections, whose CSVs replaced the earlier run's), then the folder's SHA256SUMS. ``check`` (``--render``: the
    files were written by an earlier command): the folder's SHA256SUMS is checked first."""
    from harness.integrity import check_report, seal_report

    if check:
        check_report(folder, "run the GPU benchmark again, or restore the folder (git checkout results/bench_gpu)")
    logs = sorted(folder.glob("run*.log"), key=lambda p: (len(p.name), p.name))
    head = [
        "# GPU benchmark: memory estimate, training step, peers, flex_attention",
        "",
        "Regenerate on a CUDA machine: `python -m harness.bench.gpu --out results/bench_gpu` "
        "(`--render` rewrites this file from the CSVs). Each run's log:",
        "",
    ]
    for log in logs:
        head += [f"{log.name}:", "", *(f"- {line}" for line in log.read_text().splitlines()), ""]
    body = [
        *_memory_section(_rows(folder, "memory")),
        *_steps_section(_rows(folder, "steps"), _rows(folder, "peers")),
        *_flex_section(_rows(folder, "flex")),
        *_cuda_section(_rows(folder, "cuda")),
    ]
    (folder / "README.md").write_text("\n".join(head + body))
    seal_report(folder)
