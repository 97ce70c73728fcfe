"""The report's PNG plots (matplotlib, headless Agg backend); a paper report's sections (results/grid.py,
results/theta.py) draw theirs with the same pyplot and ``save`` (the grid's Δ map and the report's final-loss map are
one ``heatmap``), the standalone figures (results/figures.py) with it.

One colour per scheme throughout, one panel per attention variant; every title names the
sweep; losses in nats/token, time in optimizer steps.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI or a server; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from results.cells import Cell, Group, Report  # noqa: E402

LOSS = "val loss (nats/token)"


def draw_all(r: Report, out_dir: Path) -> list[Path]:
    colours = _scheme_colours(r.groups)
    return [
        val_loss_curves(r, colours, out_dir / "val_loss_curves.png"),
        _final_loss_heatmap(r, out_dir / "final_val_loss_heatmap.png"),
        *(
            [_loss_vs_length(r, colours, out_dir / "val_loss_vs_length.png")]
            if any(g.at_length for g in r.groups)
            else []
        ),
        *(
            [attention_distance(r, colours, out_dir / "attention_distance.png")]
            if any(g.attn_distance.mean is not None for g in r.groups)
            else []
        ),
    ]


def _scheme_colours(groups: list[Group]) -> dict[str, tuple]:
    labels = list(dict.fromkeys(g.label for g in groups))
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _title(fig, *lines: str, fontsize: float = 10) -> None:
    """Wrapped to the figure's width: sweep names can be long and must stay readable."""
    chars = int(fig.get_figwidth() * 72 / (0.6 * fontsize))  # ≈ characters per line at this size
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in lines), fontsize=fontsize)


def _panels(r: Report, title: str, xlabel: str, ylabel: str, width: float = 5.5, grid: str = "both"):
    """One panel per attention variant, titled by it, labelled and gridded (along ``grid``)."""
    attns = list(dict.fromkeys(g.attn for g in r.groups))
    fig, axes = plt.subplots(
        1, len(attns), figsize=(width * len(attns) + 1.5, 4.8), sharey=True, squeeze=False, layout="constrained"
    )
    _title(fig, title, r.title)
    for attn, ax in zip(attns, axes[0], strict=True):
        ax.set(title=f"attn={attn}", xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3, axis=grid)
    return fig, dict(zip(attns, axes[0], strict=True))


def _mean_curve(cells: list[Cell]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps every cell evaluated at, the mean loss there and the sample std (0 for one cell)."""
    steps = sorted(set.intersection(*(set(s for s, _ in c.val) for c in cells)))
    values = np.array([[dict(c.val)[s] for s in steps] for c in cells])  # (seeds, steps)
    std = values.std(axis=0, ddof=1) if len(cells) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(axis=0), std


def val_loss_curves(r: Report, colours: dict, path: Path) -> Path:
    fig, panels = _panels(r, "Validation loss during training (mean ± std over seeds)", "optimizer step", LOSS)
    for attn, ax in panels.items():
        for g in (g for g in r.groups if g.attn == attn):
            done = [c for c in g.cells if c.finished and c.val]
            if not done:
                continue
            steps, mean, std = _mean_curve(done)
            ax.plot(steps, mean, marker="o", ms=3, color=colours[g.label], label=f"{g.label} (n={len(done)})")
            ax.fill_between(steps, mean - std, mean + std, color=colours[g.label], alpha=0.2, linewidth=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.has_data():
            ax.legend(title="pos", fontsize=8)
    return save(fig, path)


def heatmap(
    rows: list[str], cols: list[str], values: dict[tuple[str, str], float], cmap: str, figsize: tuple, **limits
):
    """A pos (``rows``) × attention (``cols``) grid coloured by ``values`` ((row, col) -> number; light grey where
    there is none), ticks labelled; (fig, ax, image). ``limits``: imshow's vmin/vmax."""
    grid = np.full((len(rows), len(cols)), np.nan)
    for (row, col), value in values.items():
        grid[rows.index(row), cols.index(col)] = value
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    image = ax.imshow(
        np.ma.masked_invalid(grid), cmap=plt.get_cmap(cmap).with_extremes(bad="lightgrey"), aspect="auto", **limits
    )
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set(xlabel="attention (attn)", ylabel="positional scheme (pos)")
    return fig, ax, image


def _final_loss_heatmap(r: Report, path: Path) -> Path:
    rows = list(dict.fromkeys(g.label for g in r.groups))
    cols = list(dict.fromkeys(g.attn for g in r.groups))
    finals = {(g.label, g.attn): g.final.mean for g in r.groups if g.final.mean is not None}
    fig, ax, image = heatmap(  # darker = higher loss = worse
        rows, cols, finals, "viridis_r", (max(7.0, 2.2 * len(cols) + 4), 0.7 * len(rows) + 2.5)
    )
    for g in r.groups:
        ax.text(
            cols.index(g.attn),
            rows.index(g.label),
            g.final.fmt(3).replace(" ± ", "\n± ") if g.final.mean is not None else g.status,
            ha="center",
            va="center",
            fontsize=9,
            color=_ink(image, g.final.mean),
        )
    _title(fig, "Final val loss (nats/token), mean ± std over seeds", r.title)
    if finals:
        fig.colorbar(image, ax=ax, label="final " + LOSS)
    return save(fig, path)


def _ink(image, value: float | None) -> str:
    """Black on light cells, white on dark ones (perceived luminance of the cell colour)."""
    if value is None:
        return "black"
    red, green, blue, _ = image.cmap(image.norm(value))
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"


def _loss_vs_length(r: Report, colours: dict, path: Path) -> Path:
    fig, panels = _panels(
        r,
        "Length extrapolation: val loss of the final model vs evaluation length",
        "evaluation length (tokens, log scale)",
        LOSS,
    )
    train_lens = {c.train_len for c in r.cells if c.train_len}
    for attn, ax in panels.items():
        for g in (g for g in r.groups if g.attn == attn and g.at_length):
            lengths = sorted(g.at_length)
            skipped = sorted({n for c in g.cells for n in c.skipped_lengths})
            ax.errorbar(
                lengths,
                np.array([g.at_length[n].mean for n in lengths]),
                yerr=np.array([g.at_length[n].std or 0.0 for n in lengths]),
                marker="o",
                capsize=3,
                color=colours[g.label],
                label=g.label + (f" (n/a at {', '.join(map(str, skipped))})" if skipped else ""),
            )
        for n in sorted(train_lens):
            ax.axvline(n, color="grey", linestyle=":", label=f"training length {n}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(r.lengths, [str(n) for n in r.lengths])
        ax.minorticks_off()
        if ax.has_data():
            ax.legend(title="pos", fontsize=8)
    return save(fig, path)


def attention_distance(r: Report, colours: dict, path: Path) -> Path:
    """Mean attention distance per scheme, one panel per attention variant (runs with diagnostics=true)."""
    fig, panels = _panels(
        r,
        "Mean attention distance of the final model (mean ± std over seeds; diagnostics=true)",
        "positional scheme (pos)",
        "Σ_j w_ij |i − j| (tokens)",
        width=4.0,
        grid="y",
    )
    for attn, ax in panels.items():
        groups = [g for g in r.groups if g.attn == attn and g.attn_distance.mean is not None]
        for x, g in enumerate(groups):
            ax.bar(x, g.attn_distance.mean, yerr=g.attn_distance.std or 0.0, capsize=3, color=colours[g.label])
        ax.set_xticks(range(len(groups)), [g.label for g in groups], rotation=30, ha="right")
    return save(fig, path)


def save(fig, path: Path, dpi: int = 110, **options) -> Path:
    fig.savefig(path, dpi=dpi, **options)
    plt.close(fig)
    return path
