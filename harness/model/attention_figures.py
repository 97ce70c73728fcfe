"""The figures of the attention diagnostics (harness/model/diagnostics.py) as PNG bytes by file name.

Drawn on matplotlib ``Figure`` objects (the Agg canvas; no pyplot, so no display and no global backend).
Layers are rows and heads columns throughout; distances in tokens, entropies in nats.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from matplotlib.figure import Figure

SIGNED_NOTE = "|w| renormalised per query: numerator-mode RoPE applies signed weights"


def draw(diag) -> dict[str, bytes]:
    """``diag``: a ``Diagnostics``. Returns attention_{distance,entropy,by_offset,maps}.png."""
    T = (diag.measured()[0].pairs.numel() + 1) // 2
    note = [SIGNED_NOTE] if diag.signed else []
    return {
        "attention_distance.png": heatmap(
            torch.stack([s.mean_distance for s in diag.measured()]).numpy(),  # (L, H)
            [
                "Mean attention distance Σ_j w_ij |i − j| (tokens)",
                f"uniform over {T} keys: {(T * T - 1) / (3 * T):.1f}",
                *note,
            ],
        ),
        "attention_entropy.png": heatmap(
            torch.stack([s.mean_entropy for s in diag.measured()]).numpy(),
            ["Attention entropy −Σ_j w_ij ln w_ij (nats)", f"uniform over {T} keys: ln {T} = {math.log(T):.2f}", *note],
        ),
        "attention_by_offset.png": by_offset(diag, T, note),
        "attention_maps.png": maps(diag, note),
    }


def heatmap(grid: np.ndarray, title: list[str]) -> bytes:
    """A layer × head grid, each cell annotated with its value."""
    L, H = grid.shape
    fig = Figure(figsize=(max(5.0, 0.9 * H + 2.5), 0.5 * L + 2.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    lo, hi = float(np.nanmin(grid)), float(np.nanmax(grid))
    for (layer, head), value in np.ndenumerate(grid):
        light = hi == lo or (value - lo) / (hi - lo) > 0.6  # viridis is light at the top of its range
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=8, color="black" if light else "white")
    ax.set(
        xticks=range(H),
        xticklabels=[str(h) for h in range(H)],
        yticks=range(L),
        yticklabels=[str(layer) for layer in range(L)],
        xlabel="head",
        ylabel="layer",
    )
    fig.colorbar(image, ax=ax)
    fig.suptitle("\n".join(title), fontsize=9)
    return png(fig)


def by_offset(diag, T: int, note: list[str]) -> bytes:
    """Mean weight at each offset i − j (mean over heads), one line per layer, log scale: local or far?"""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    offsets = np.arange(-(T - 1), T)
    for layer, s in enumerate(diag.measured()):
        profile = np.nanmean(s.offset_profile.numpy(), axis=0)  # (2T − 1,)
        ax.plot(offsets, np.where(profile > 0, profile, np.nan), label=f"layer {layer}", lw=1.2)
    ax.axhline(1 / T, color="grey", ls=":", label=f"uniform over {T} keys")
    ax.set(
        yscale="log", xlabel="offset i − j (tokens; > 0: the key precedes the query)", ylabel="mean attention weight"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("\n".join(["Attention weight by relative offset (mean over queries and heads)", *note]), fontsize=9)
    return png(fig)


def maps(diag, note: list[str]) -> bytes:
    """One validation window's attention, a T×T image per layer (rows) and head (columns)."""
    L, H = len(diag.maps), diag.maps[0].shape[0]
    fig = Figure(figsize=(1.9 * H + 0.6, 1.9 * L + 0.9), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    for (layer, head), ax in np.ndenumerate(axes):
        image = diag.maps[layer][head].numpy()
        top = float(np.quantile(image, 0.995)) or None  # a few peaked entries would leave the rest dark
        ax.imshow(image, cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest")
        ax.set(xticks=[], yticks=[])
        ax.set_title(f"layer {layer} · head {head}", fontsize=7)
    fig.suptitle(
        "\n".join(
            [
                "Attention of one validation window: query i down, key j across (colour capped at "
                "each map's 99.5th percentile)",
                *note,
            ]
        ),
        fontsize=9,
    )
    return png(fig)


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
