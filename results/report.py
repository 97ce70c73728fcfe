"""The comparison report as files: report.md (one row per scheme × attention, mean ± std over
seeds), report.csv and the plots (results/plots.py). The data model is results/cells.py."""

from __future__ import annotations

import re
from pathlib import Path

from harness.markdown import csv_text, table
from results import plots, spread, verdicts
from results.cells import Cell, Group, Report, Stat, mean_std

TOKEN_ACC = re.compile(r"^val/token_acc_at_(\d+)$")  # a synthetic task's per-token accuracy at length L
PART_TOKEN_ACC = re.compile(r"^val/(\w+)/token_acc_at_(\d+)$")  # a mixture part's (harness/data/tasks/mixture.py)

# ---------------------------------------------------------------- text outputs


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _steps(g: Group) -> str:
    done = sum(c.finished for c in g.cells)
    if g.steps.mean is None:
        return "—" if done == 0 else "not reached"
    return g.steps.fmt(0) + ("" if g.steps.n == done else f" ({g.steps.n}/{done} seeds)")


def _seeds(g: Group) -> str:
    return ",".join(c.seed for c in g.cells)


def markdown(r: Report, plots: list[str]) -> str:
    target = f"{r.target:.4f}" if r.target is not None else "—"
    variant = any(g.variant for g in r.groups)
    accuracy = any(g.acc.mean is not None for g in r.groups)
    bits = any(g.bpc.mean is not None for g in r.groups)
    head = [
        "pos",
        "attn",
        *(["variant"] if variant else []),
        "seeds",
        "status",
        "final val loss",
        *(["final bits/byte"] if bits else []),
        "best val loss",
        f"steps to {target}",
        "tokens/s",
        "params",
        "order gain",
        *(["val acc"] if accuracy else []),
    ]
    rows = [
        [
            g.pos,
            g.attn,
            *([g.variant] if variant else []),
            _seeds(g),
            g.status,
            g.final.fmt(),
            *([g.bpc.fmt() if g.bpc.mean is not None else "—"] if bits else []),
            g.best.fmt(),
            _steps(g),
            g.tokens_per_s.fmt(0) if g.tokens_per_s.mean is not None else "—",
            _num(g.n_params, 0),
            order_gain(g, r.min_order_gain),
            *([g.acc.fmt(3)] if accuracy else []),
        ]
        for g in r.groups
    ]
    found = verdicts.verdicts(r.groups, r.min_order_gain, r.baseline, r.alpha, r.margin, r.staged)
    missing = verdicts.missing_baseline(r.groups, r.baseline)
    lines = [
        f"# {r.title}",
        "",
        *r.header,
        "",
        f"**{verdicts.headline(found, r.min_order_gain, missing, r.alpha, r.margin)}**",
        "",
        "## Scheme × attention",
        "",
        *table(head, rows, escape=True),
        "",
        "Losses in nats/token (mean ± sample std over finished seeds)"
        + (
            "; bits/byte: the final val loss per byte of text (val/bpc: nats/token × tokens/byte ÷ ln 2, "
            "comparable across tokenizers)"
            if bits
            else ""
        )
        + f". Target loss {target} nats/token: "
        f"{r.target_note}. Steps are optimizer steps; tokens/s is training throughput. Order gain: "
        "val loss with the tokens of each window shuffled minus val loss, nats/token; below "
        f"{r.min_order_gain} (report.min_order_gain) a cell is **not yet using order** and a comparison "
        "resting on it says little about its positional scheme.",
        "",
        *verdicts.section(found, r.min_order_gain, r.baseline, missing, r.alpha, r.margin),
    ]
    measured = [  # (title, its table: None where no cell measured it, what the table shows)
        (
            "Where the spread comes from",
            _spread_rows(r),
            "Every run scores the same validation windows. sd between runs: of the final val loss (nats/token); seeds:"
            " the part the trained models differ by, which only more seeds average out; validation sample: the part "
            "from how each model fares on the windows drawn, which more validation windows shrink (σ_e/√n of the seeds"
            " × windows table, results/spread.py); the two add in squares. On Δ vs baseline: the error the finite "
            "validation sample puts on the arm's difference from its baseline, the windows paired (sd of the "
            "per-window differences / √n); the verdicts' intervals hold the windows fixed and leave it out. shrunk by:"
            " the larger part.",
        ),
        (
            "Loss vs evaluation length (nats/token)",
            _length_rows(r) if r.lengths else None,
            "n/a: the scheme refuses that length (see the run's `eval_skipped_at_<L>` tag).",
        ),
        (
            "Accuracy vs evaluation length (synthetic tasks)",
            _accuracy_rows(r),
            "Per output token (`val/token_acc_at_<L>`, Ruoss et al. 2023; mean ± std over seeds), then exact "
            "match per sequence in parentheses (`val/acc_at_<L>`, Kazemnejad et al. 2023). The *position-blind* "
            "rows are what the best rule over the bag of input tokens scores on the same lengths "
            "(harness/data/tasks/blind.py; encoder forms): a score at or below it shows no use of positions.",
        ),
        (
            "Loss vs length under each evaluation (nats/token)",
            _condition_rows(r) if any(set(g.conditions) - {"windows"} for g in r.groups) else None,
            "windows: non-overlapping windows of L tokens; sliding, stride S: windows advancing S tokens, "
            "each scoring only its new tokens; a task name (mixture part): that part's own examples of a task=mixture "
            "run; a scaling name (linear = PI, ntk, dynamic_ntk, yarn, ...): "
            "the same trained model evaluated with that RoPE scaling (s = L ÷ training length); fine-tuned: "
            "after eval.finetune_steps at eval.finetune_length with that scaling applied; last K tokens: "
            "the same final K targets of each sample scored with L tokens of context. posbench's "
            "docs/length-extrapolation.md.",
        ),
        (
            "Attention (diagnostics=true)",
            _attention_rows(r) if any(g.attn_distance.mean is not None for g in r.groups) else None,
            "Σ_j w_ij |i − j| and −Σ_j w_ij ln w_ij of the final model's attention, averaged over queries, "
            "heads and layers on 16 validation windows (mean ± std over seeds); each run's `diagnostics/` "
            "artifacts hold them per layer and head, by offset, and as maps.",
        ),
    ]
    for title, shown, note in measured:
        if shown is not None:
            lines += [f"## {title}", "", *table(*shown, escape=True), "", note, ""]
    cell_rows = [
        [c.label, c.name, c.status, _num(c.final_loss, 4), _num(c.tokens_per_s, 0), c.reason]
        for c in sorted(r.cells, key=lambda c: c.job)
    ]
    lines += [
        "## Cells",
        "",
        *table(["cell", "run", "status", "final val loss", "tokens/s", "reason"], cell_rows, escape=True),
        "",
        *(f"![{Path(p).stem}]({p})" for p in plots),
    ]
    return "\n".join(lines) + "\n"


# after an order gain: whether the model uses word order (None: it cannot — NoPE in a bidirectional model)
ORDER_MARK = {None: " (NoPE, bidirectional: none by construction)", True: "", False: " ⚠ not yet using order"}


def _spread_rows(r: Report) -> tuple[list[str], list[list[str]]] | None:
    """Each arm's spread between runs, split into its seeds' part and its validation sample's (results/spread.py),
    and the validation sample's error on the arm's Δ from its baseline, the windows paired."""
    tables = [(g, spread.table([c.windows for c in g.cells if c.finished and c.windows])) for g in r.groups]
    rows = []
    for g, x in tables:
        if x is None:
            continue
        base = verdicts.baseline_of([h for h in r.groups if (h.attn, h.variant) == (g.attn, g.variant)], r.baseline)
        y = next((t for h, t in tables if h is base and h is not g), None)
        paired = spread.paired_error(x, y) if y is not None else None
        part = spread.split(x)
        rows.append(
            [
                g.pos,
                g.attn,
                *([g.variant] if any(h.variant for h in r.groups) else []),
                f"{part.runs} × {part.windows}",
                f"{part.spread:.4f}",
                f"{part.seeds:.4f}",
                f"{part.sample:.4f}",
                "—" if paired is None else f"{paired:.4f}",
                part.shrinks,
            ]
        )
    if not rows:
        return None
    return (
        [
            "pos",
            "attn",
            *(["variant"] if any(h.variant for h in r.groups) else []),
            "runs × windows",
            "sd between runs",
            "seeds",
            "validation sample",
            "on Δ vs baseline",
            "shrunk by",
        ],
        rows,
    )


def order_gain(g: Group, min_gain: float) -> str:
    """The group's order gain, marked when the model does not (yet) use word order."""
    return "—" if g.order_gain.mean is None else g.order_gain.fmt(3) + ORDER_MARK[g.using_order(min_gain)]


def _length_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            g.label,
            g.attn,
            *(
                g.at_length[n].fmt()
                if n in g.at_length
                else ("n/a" if any(n in c.skipped_lengths for c in g.cells) else "—")
                for n in r.lengths
            ),
        ]
        for g in r.groups
    ]
    return ["pos", "attn", *(f"L={n}" for n in r.lengths)], rows


def _accuracy_rows(r: Report) -> tuple[list[str], list[list[str]]] | None:
    """Per group, per-token accuracy (mean ± std) and exact match (mean) at each evaluated task length, with each
    task's position-blind baseline as a row of its own; a mixture's parts (task=mixture) each get their
    rows under the pooled one. None when no cell scored a task."""

    def at(cells, name: str, n: int) -> Stat:
        return mean_std([c.metrics[f"{name}_at_{n}"] for c in cells if c.finished and f"{name}_at_{n}" in c.metrics])

    keys = {k for g in r.groups for c in g.cells for k in c.metrics}
    lengths = sorted({int(m[1]) for k in keys if (m := TOKEN_ACC.match(k))})
    if not lengths:
        return None
    parts = sorted({m[1] for k in keys if (m := PART_TOKEN_ACC.match(k))})
    rows: list[list[str]] = []
    blind_rows: dict[tuple[str, ...], tuple[int, str]] = {}  # (task, its figures) -> (its row, the arm shown)
    for g in r.groups:
        for part in (None, *parts):
            prefix = "val/" if part is None else f"val/{part}/"
            scored = [(at(g.cells, f"{prefix}token_acc", n), at(g.cells, f"{prefix}acc", n)) for n in lengths]
            rows.append(
                [
                    g.label if part is None else f"{g.label} · {part}",
                    g.attn,
                    *(f"{t.fmt(3)} ({e.fmt(3)})" if t.mean is not None else "—" for t, e in scored),
                ]
            )
            blind = [
                (at(g.cells, f"{prefix}blind_token_acc", n), at(g.cells, f"{prefix}blind_acc", n)) for n in lengths
            ]
            shown = [f"{b.mean:.3f} ({e.mean:.3f})" if b.mean is not None else "—" for b, e in blind]
            # the task's baseline, not an arm's: one row per task, each named by its arm where arms' differ
            task = " ".join([*(o for o in g.variant.split() if o.startswith("task=")), *([part] if part else [])])
            seen = (task, *shown)
            if seen not in blind_rows and any(b.mean is not None for b, _ in blind):
                blind_rows[seen] = (len(rows), f"{g.variant} {part or ''}")
                rows.append([f"position-blind {task}".strip(), "—", *shown])
    for (task, *_), (i, arm) in blind_rows.items():
        if sum(k[0] == task for k in blind_rows) > 1:  # arms' figures for the task differ: name each row's arm
            rows[i][0] = f"position-blind {arm}".strip()
    return ["pos", "attn", *(f"L={n}" for n in lengths)], rows


def _condition_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    lengths = sorted({n for g in r.groups for by_len in g.conditions.values() for n in by_len})
    rows = [
        [g.label, g.attn, name, *(by_len[n].fmt() if n in by_len else "—" for n in lengths)]
        for g in r.groups
        for name, by_len in sorted(g.conditions.items(), key=lambda kv: (kv[0] != "windows", "fine-tuned" in kv[0]))
    ]
    return ["pos", "attn", "evaluation", *(f"L={n}" for n in lengths)], rows


def _attention_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    head = ["pos", "attn", "mean attention distance (tokens)", "attention entropy (nats)"]
    return head, [
        [g.label, g.attn, g.attn_distance.fmt(2), g.attn_entropy.fmt(3)]
        for g in r.groups
        if g.attn_distance.mean is not None
    ]


def _to_csv(r: Report) -> str:
    lengths = r.lengths
    return csv_text(
        [
            "pos",
            "attn",
            "variant",
            "seeds",
            "n_finished",
            "status",
            "final_val_loss_mean",
            "final_val_loss_std",
            "best_val_loss_mean",
            "best_val_loss_std",
            "target_loss",
            "steps_to_target_mean",
            "steps_to_target_std",
            "seeds_reaching_target",
            "tokens_per_s_mean",
            "n_params",
            *(f"val_loss_at_{n}_mean" for n in lengths),
            "order_gain_mean",
            "order_gain_std",
            "using_order",
            "val_acc_mean",
            "val_acc_std",
            "attn_distance_mean",
            "attn_entropy_mean",
        ],
        (
            [
                g.pos,
                g.attn,
                g.variant,
                _seeds(g),
                g.final.n,
                g.status,
                g.final.mean,
                g.final.std,
                g.best.mean,
                g.best.std,
                r.target,
                g.steps.mean,
                g.steps.std,
                g.steps.n,
                g.tokens_per_s.mean,
                g.n_params,
                *(g.at_length[n].mean if n in g.at_length else None for n in lengths),
                g.order_gain.mean,
                g.order_gain.std,
                g.using_order(r.min_order_gain),
                g.acc.mean,
                g.acc.std,
                g.attn_distance.mean,
                g.attn_entropy.mean,
            ]
            for g in r.groups
        ),
    )


def console_summary(r: Report) -> str:
    """What a sweep prints at its end: one line per cell (its order gain marked when the model does not
    use word order yet), then the report's verdicts, so the terminal gives the answer and not only numbers."""
    cells = sorted(r.cells, key=lambda c: c.job)
    width = max([len("cell"), *(len(c.label) for c in cells)])
    found = verdicts.verdicts(r.groups, r.min_order_gain, r.baseline, r.alpha, r.margin, r.staged)
    missing = verdicts.missing_baseline(r.groups, r.baseline)
    lines = [
        f"{'cell':<{width}}  {'status':<12}  {'val loss':>9}  {'tokens/s':>9}  order gain",
        *(
            f"{c.label:<{width}}  {c.status:<12}  {_num(c.final_loss, 4):>9}  {_num(c.tokens_per_s, 0):>9}"
            f"  {_cell_order_gain(c, r.min_order_gain)}"
            for c in cells
        ),
        *(f"  {c.label}: {c.reason}" for c in cells if c.reason),
        "",
        verdicts.headline(found, r.min_order_gain, missing, r.alpha, r.margin),
        *(
            f"  {f.group.label} vs {f.baseline.pos} ({f.group.attn}): "  # same variant
            + (f.text if f.text.startswith(f.verdict) else f"{f.verdict}: {f.text}")
            for f in found
        ),
    ]
    return "\n".join(lines)


def _cell_order_gain(c: Cell, min_gain: float) -> str:
    if c.order_gain is None:
        return "—"
    return f"{c.order_gain:.3f}" + ORDER_MARK[None if c.order_signal == "none" else c.order_gain >= min_gain]


def headline_metrics(cells: list[Cell]) -> dict[str, float]:
    """What a sweep's parent run shows in the runs table: the best and worst cell's final val loss
    (nats/token, finished cells) and how many cells finished, were refused (incompatible) or failed."""
    finals = [c.final_loss for c in cells if c.finished and c.final_loss is not None]
    refused = sum(c.status == "incompatible" for c in cells)
    finished = sum(c.finished for c in cells)
    losses = {"sweep/best_val_loss": min(finals), "sweep/worst_val_loss": max(finals)} if finals else {}
    return {
        **losses,
        "sweep/cells_finished": finished,
        "sweep/cells_refused": refused,
        "sweep/cells_failed": len(cells) - finished - refused,
    }


def write_report(r: Report, out_dir: Path) -> list[Path]:
    """report.md, report.csv and the PNG plots into out_dir, a folder that exists (a command's
    ``integrity.report_folder``, which seals them); returns the paths written."""
    written = plots.draw_all(r, out_dir)
    (out_dir / "report.csv").write_text(_to_csv(r))
    (out_dir / "report.md").write_text(markdown(r, [p.name for p in written]))
    return [out_dir / "report.md", out_dir / "report.csv", *written]
