"""The grid section of a paper report: does each scheme help, per attention variant, beyond seed noise?

For every (pos, attn) cell with finished seeds (attn with the sweep's other axes, its variant: one column each), the
difference of its mean final val loss from ``pos=none`` in the same column, with a Welch 95 % interval
(harness.stats.welch_interval) and Welch's p;
the grid's cells are one family, Holm-corrected at family-wise level 0.05 (report.alpha's default):
  grid_delta.png   the differences as a heatmap centred at 0 (blue: lower loss than none); a cell
                   Holm does not reject is marked "≈" (within seed noise)
  a table          the same numbers, refused pairings with their reason
Returns the README lines that embed them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harness.markdown import table
from harness.stats import welch_interval
from results.cells import ALPHA, MIN_ORDER_GAIN, group_cells
from results.verdicts import BASELINE, verdicts


# a cell's (or group's) column: its attention and the sweep's other axes (its variant): a sweep over model=… as well
# as pos and attn compares each pos with none under the same attention and model, never the two models pooled
def _column(x) -> str:
    return f"{x.attn} {x.variant}".strip()


def _finals(cells) -> dict[tuple[str, str], list[float]]:
    return {(g.pos, _column(g)): g.finals for g in group_cells(cells, None) if g.finals}


def _deltas(cells) -> dict[tuple[str, str], tuple[float, float, float, int] | None]:
    """(pos, column) -> (Δ, CI low, CI high, n) against pos=none in the same column; None without an interval."""
    finals = _finals(cells)
    cis = {
        (pos, attn): welch_interval(xs, finals[(BASELINE, attn)]) if (BASELINE, attn) in finals else None
        for (pos, attn), xs in finals.items()
        if pos != BASELINE
    }
    return {key: (*ci, len(finals[key])) if ci is not None else None for key, ci in cis.items()}


def decisions(
    cells, alpha: float = ALPHA, min_gain: float = MIN_ORDER_GAIN
) -> dict[tuple[str, str], tuple[float | None, str]]:
    """(pos, attn) -> (Welch's p against pos=none, "better" | "worse" | "≈" | "premature"): the sweep report's own
    verdicts (results/verdicts.py), so the grid and the report say one thing — the cells with two seeds a side one
    family, Holm-corrected at ``alpha`` (a grid of 32 cells at 95 % each would mark one or two by chance); a cell
    whose models do not use word order yet is premature, its hypothesis still one of the family's."""
    marks = {"lower": "better", "higher": "worse", "premature": "premature"}
    return {
        (v.group.pos, _column(v.group)): (v.p, marks.get(v.verdict, "≈"))
        for v in verdicts(group_cells(cells, None), min_gain, None, alpha)
    }


def learned(cells, min_gain: float = MIN_ORDER_GAIN) -> dict[tuple[str, str], str]:
    """(pos, attn) -> what its finished seeds learned: exact match (synthetic tasks) and the order gain,
    flagged when below ``min_gain``; NoPE in a bidirectional model cannot use order at all."""
    out = {}
    for g in group_cells(cells, None):  # each group's figures over its finished seeds
        parts = [f"acc {g.acc.mean:.3f}"] if g.acc.mean is not None else []
        if g.order_signal == "none":
            parts.append("no order signal")
        elif g.order_gain.mean is not None:
            parts.append(
                f"gain {g.order_gain.mean:.2f}" + ("" if g.using_order(min_gain) else " ⚠ not yet using order")
            )
        if any(c.finished for c in g.cells):
            out[(g.pos, _column(g))] = ", ".join(parts) or "—"
    return dict(sorted(out.items()))


def grid_section(client, cells, out: Path) -> list[str]:
    from results.plots import heatmap, save

    d, losses, decided = _deltas(cells), _finals(cells), decisions(cells)
    poss = sorted({c.pos for c in cells} - {BASELINE})
    attns = sorted({_column(c) for c in cells})
    # refused pairings, and cells whose config the validation pass refused (e.g. a window longer than the task)
    trained = {(c.pos, _column(c)) for c in cells if c.finished}
    refused = {
        (c.pos, _column(c)): c.reason
        for c in cells
        if c.status in ("incompatible", "error") and c.reason and (c.pos, _column(c)) not in trained
    }

    def delta_cell(pos: str, attn: str) -> str:
        if (pos, attn) in refused:
            return "refused"
        delta = d.get((pos, attn))
        if delta is None:
            finals, base = losses.get((pos, attn)), losses.get((BASELINE, attn))
            if finals and base:
                return f"{sum(finals) / len(finals) - sum(base) / len(base):+.3f} (no interval: one seed)"
            return "—"
        diff, low, high, n = delta
        p, mark = decided.get((pos, attn), (None, "≈"))
        return f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]{f' p={p:.1g}' if p is not None else ''} {mark} (n={n})"

    shown = {key: v for key, v in d.items() if v is not None}  # the cells with an interval
    marks = Counter(mark for _, mark in decided.values())  # better, worse, ≈, premature
    what = learned(cells)
    unready = [k for k, v in what.items() if "not yet" in v]
    head = ["pos", *(f"attn={a}" for a in attns)]
    lines = [
        "## Each scheme against no position encoding",
        "",
        f"Δ = mean final val loss (nats/token) of the cell − that of `pos={BASELINE}` with the same attention, "
        "95 % Welch interval in brackets, Welch's two-sided p; **better** / **worse** where Holm's step-down "
        f"procedure over the grid's {len(shown)} cells with an interval "
        f"rejects at family-wise α = {ALPHA:g} (the sweep report's verdicts), ≈ where it does not; premature: "
        "the cell's models do not use word order yet (no mark, its hypothesis still counted in the family).",
        "",
        *table(head, [[pos, *(delta_cell(pos, a) for a in attns)] for pos in poss], escape=True),
        "",
        f"{marks['better']} of {len(shown)} cells beat `pos={BASELINE}` beyond seed noise (Holm-corrected), "
        f"{marks['worse']} are worse, "
        f"{len(shown) - marks['better'] - marks['worse'] - marks['premature']} are within noise"
        + (f", {marks['premature']} premature" if marks["premature"] else "")
        + (f"; {len(d) - len(shown)} have too few seeds for an interval." if len(d) > len(shown) else "."),
        "",
        "What each cell learned: exact match on the training lengths (synthetic tasks; mean over seeds) and "
        f"the order gain (nats/token lost when each window's order is shuffled; below {MIN_ORDER_GAIN}: not yet "
        "using order, and its Δ says little about its scheme).",
        "",
        *table(
            head,
            [
                [pos, *("refused" if (pos, a) in refused else what.get((pos, a), "—") for a in attns)]
                for pos in [BASELINE, *poss]
            ],
            escape=True,
        ),
        "",
        f"{len(what) - len(unready)} of {len(what)} trained cells use word order or cannot "
        f"(pos={BASELINE}); {len(unready)} do not yet"
        + (": " + ", ".join(f"{p}×{a}" for p, a in unready) if unready else "")
        + ".",
        "",
        *(
            f"Refused ({', '.join(f'{p}×{a}' for (p, a), r in refused.items() if r == reason)}): {reason}"
            for reason in sorted(set(refused.values()))
        ),
    ]

    span = max((abs(v[0]) for v in shown.values()), default=1.0)  # a scale symmetric about 0
    fig, ax, image = heatmap(  # blue: lower loss than none
        poss,
        attns,
        {key: v[0] for key, v in shown.items()},
        "RdBu_r",
        (2.4 * len(attns) + 3, 0.7 * len(poss) + 2.2),
        vmin=-span,
        vmax=span,
    )
    for (pos, attn), v in shown.items():
        ax.text(
            attns.index(attn),
            poss.index(pos),
            f"{v[0]:+.3f}\n{decided.get((pos, attn), (0, '≈'))[1]}",
            ha="center",
            va="center",
            fontsize=9,
        )
    for pos, attn in refused:
        if pos in poss:
            ax.text(attns.index(attn), poss.index(pos), "refused", ha="center", va="center", fontsize=9)
    ax.set_title(f"Final val loss − pos={BASELINE} (same attn), mean over seeds; ≈: not beyond noise (Holm)")
    fig.colorbar(image, ax=ax, label="Δ nats/token")
    save(fig, out / "grid_delta.png")
    return lines + ["", "![grid_delta](grid_delta.png)"]
