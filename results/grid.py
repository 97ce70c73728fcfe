"""The grid section of a paper report: does each scheme help, per attention variant, beyond seed noise?

For every (pos, attn) cell with finished seeds, the difference of its mean final val loss from
``pos=none`` with the same attention, with a Welch 95 % interval (harness.stats.welch_interval):
  grid_delta.png   the differences as a heatmap centred at 0 (blue: lower loss than none); a cell
                   whose interval contains 0 is marked "≈" (within seed noise)
  a table          the same numbers, refused pairings with their reason
Returns the README lines that embed them.
"""

from __future__ import annotations

from pathlib import Path

from harness.stats import welch_interval
from results.cells import MIN_ORDER_GAIN

BASELINE = "none"


def _finals(cells) -> dict[tuple[str, str], list[float]]:
    finals: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        if c.finished and c.final_loss is not None:
            finals.setdefault((c.pos, c.attn), []).append(c.final_loss)
    return finals


def deltas(cells) -> dict[tuple[str, str], tuple[float, float, float, int] | None]:
    """(pos, attn) -> (Δ, CI low, CI high, n) against pos=none with the same attn; None without an interval."""

    finals = _finals(cells)
    out = {}
    for (pos, attn), xs in finals.items():
        if pos == BASELINE:
            continue
        base = finals.get((BASELINE, attn), [])
        ci = welch_interval(xs, base) if base else None
        out[(pos, attn)] = (*ci, len(xs)) if ci is not None else None
    return out


def learned(cells, min_gain: float = MIN_ORDER_GAIN) -> dict[tuple[str, str], str]:
    """(pos, attn) -> what its finished seeds learned: exact match (synthetic tasks) and the order gain,
    flagged when below ``min_gain``; NoPE in a bidirectional model cannot use order at all."""
    out = {}
    for key in sorted({(c.pos, c.attn) for c in cells if c.finished}):
        done = [c for c in cells if c.finished and (c.pos, c.attn) == key]
        accs = [c.acc for c in done if c.acc is not None]
        gains = [c.order_gain for c in done if c.order_gain is not None]
        parts = [f"acc {sum(accs) / len(accs):.3f}"] if accs else []
        if done[0].order_signal == "none":
            parts.append("no order signal")
        elif gains:
            gain = sum(gains) / len(gains)
            parts.append(f"gain {gain:.2f}" + (" ⚠ not yet using order" if gain < min_gain else ""))
        out[key] = ", ".join(parts) or "—"
    return out


def _mark(low: float, high: float) -> str:
    return "better" if high < 0 else "worse" if low > 0 else "≈"


def grid_section(client, cells, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    d, losses = deltas(cells), _finals(cells)
    poss = sorted({c.pos for c in cells} - {BASELINE})
    attns = sorted({c.attn for c in cells})
    # refused pairings, and cells whose config the validation pass refused (e.g. a window longer than the task)
    trained = {(c.pos, c.attn) for c in cells if c.finished}
    refused = {(c.pos, c.attn): c.reason for c in cells
               if c.status in ("incompatible", "error") and c.reason and (c.pos, c.attn) not in trained}
    lines = ["## Each scheme against no position encoding", "",
             f"Δ = mean final val loss (nats/token) of the cell − that of `pos={BASELINE}` with the same attention, "
             "95 % Welch interval in brackets; **better** / **worse** when the interval excludes 0, "
             "≈ when it does not.",
             "", "| pos | " + " | ".join(f"attn={a}" for a in attns) + " |", "|---|" + "---|" * len(attns)]
    for pos in poss:
        row = []
        for attn in attns:
            if (pos, attn) in refused:
                row.append("refused")
            elif d.get((pos, attn)) is None:
                finals, base = losses.get((pos, attn)), losses.get((BASELINE, attn))
                row.append(f"{sum(finals) / len(finals) - sum(base) / len(base):+.3f} (no interval: one seed)"
                           if finals and base else "—")
            else:
                diff, low, high, n = d[(pos, attn)]
                row.append(f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] {_mark(low, high)} (n={n})")
        lines.append(f"| {pos} | " + " | ".join(row) + " |")
    shown = [v for v in d.values() if v is not None]
    better = sum(v[2] < 0 for v in shown)
    worse = sum(v[1] > 0 for v in shown)
    lines += ["", f"{better} of {len(shown)} cells beat `pos={BASELINE}` beyond seed noise, {worse} are worse, "
              f"{len(shown) - better - worse} are within noise"
              + (f"; {len(d) - len(shown)} have too few seeds for an interval." if len(d) > len(shown) else ".")]
    what = learned(cells)
    unready = [k for k, v in what.items() if "not yet" in v]
    lines += ["", "What each cell learned: exact match on the training lengths (synthetic tasks; mean over seeds) and "
              f"the order gain (nats/token lost when each window's order is shuffled; below {MIN_ORDER_GAIN}: not yet "
              "using order, and its Δ says little about its scheme).", "",
              "| pos | " + " | ".join(f"attn={a}" for a in attns) + " |", "|---|" + "---|" * len(attns)]
    for pos in [BASELINE, *poss]:
        lines.append(f"| {pos} | " + " | ".join("refused" if (pos, a) in refused else what.get((pos, a), "—")
                                                 for a in attns) + " |")
    lines += ["", f"{len(what) - len(unready)} of {len(what)} trained cells use word order or cannot "
              f"(pos={BASELINE}); {len(unready)} do not yet" + (": " + ", ".join(f"{p}×{a}" for p, a in unready)
                                                                 if unready else "") + ".", ""]
    for reason in sorted(set(refused.values())):
        cells_refused = ", ".join(f"{p}×{a}" for (p, a), r in refused.items() if r == reason)
        lines.append(f"Refused ({cells_refused}): {reason}")

    grid = np.full((len(poss), len(attns)), np.nan)
    for (pos, attn), v in d.items():
        if v is not None:
            grid[poss.index(pos), attns.index(attn)] = v[0]
    span = float(np.nanmax(np.abs(grid))) if not np.isnan(grid).all() else 1.0
    fig, ax = plt.subplots(figsize=(2.4 * len(attns) + 3, 0.7 * len(poss) + 2.2), layout="constrained")
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="lightgrey")  # blue: lower loss than none
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-span, vmax=span, aspect="auto")
    for (pos, attn), v in d.items():
        if v is not None:
            ax.text(attns.index(attn), poss.index(pos), f"{v[0]:+.3f}\n{_mark(v[1], v[2])}", ha="center",
                    va="center", fontsize=9)
    for pos, attn in refused:
        if pos in poss:
            ax.text(attns.index(attn), poss.index(pos), "refused", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(attns)), attns)
    ax.set_yticks(range(len(poss)), poss)
    ax.set(xlabel="attention (attn)", ylabel="positional scheme (pos)",
           title=f"Final val loss − pos={BASELINE} (same attn), mean over seeds; ≈: 95 % CI contains 0")
    fig.colorbar(image, ax=ax, label="Δ nats/token")
    fig.savefig(out / "grid_delta.png", dpi=110)
    plt.close(fig)
    return lines + ["", "![grid_delta](grid_delta.png)"]
