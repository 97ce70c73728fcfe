"""Attention diagnostics (``diagnostics=true``): what the trained model's attention looks like.

On a few validation windows every layer's attention variant forms the weights it applies,
``implied_weights(q, k, ctx)`` (explicit T×T: softmax's own, local's band, kernelized attention's
normalised kernel matrix), captured by forward hooks on the variants. Per layer and head:

  mean attention distance  Σ_j w_ij |i − j| averaged over queries, in tokens (the "attention distance"
                           of Dosovitskiy et al. 2021, Fig. 7, over sequence positions instead of pixels);
  attention entropy        −Σ_j w_ij ln w_ij averaged over queries, in nats (ln T for uniform attention);
  weight by offset         the mean w_{i, i−o} over the queries where key i − o exists: local or far?

Queries at padded positions and queries that see no key are left out. Numerator-mode RoPE in kernelized
attention (RoFormer Eq. 19) applies signed weights whose rows need not sum to 1; the statistics then read
|w| renormalised per row (``as_distribution``), and the figures say so. ``weights_error`` is how far w @ v
is from the variant's own output (relative to its largest entry): the weights drawn are the ones applied.

The figures are PNG bytes by file name, drawn on matplotlib ``Figure`` objects (the Agg canvas; no pyplot, so no
display and no global backend); layers are rows and heads columns throughout, distances in tokens, entropies in
nats.

Notation: B batch, H heads, T length, L layers.
"""

from __future__ import annotations

import inspect
import io
import math
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from harness.data.loaders import on_device
from harness.markdown import csv_text

WINDOWS = 16  # validation windows looked at
CHUNK_ELEMS = 1 << 24  # B·H·T² weights formed at once per layer (64 MiB in fp32)


@dataclass
class AttentionStats:
    """Sums over the counted queries of one layer, per head: they add up over batches."""

    distance: Tensor  # (H,) Σ_queries Σ_j w_ij |i − j|
    entropy: Tensor  # (H,) Σ_queries −Σ_j w_ij ln w_ij
    queries: Tensor  # () number of queries counted
    by_offset: Tensor  # (H, 2T − 1) Σ_queries w_{i, i−o}; column o + T − 1 holds offset o = i − j
    pairs: Tensor  # (2T − 1,) counted (query, key) pairs at each offset

    def __add__(self, other: AttentionStats) -> AttentionStats:
        return AttentionStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def mean_distance(self) -> Tensor:
        return self.distance / self.queries  # (H,)

    @property
    def mean_entropy(self) -> Tensor:
        return self.entropy / self.queries  # (H,)

    @property
    def offset_profile(self) -> Tensor:
        """(H, 2T − 1) mean weight at each offset i − j; NaN where no counted pair has that offset."""
        return self.by_offset / self.pairs.where(self.pairs > 0, torch.nan)


def as_distribution(w: Tensor) -> Tensor:
    """|w| over its row sum (rows of zeros stay zeros): the identity on attention that already is a
    distribution; for signed weights (numerator-mode RoPE) where each query puts its absolute mass."""
    mass = w.abs()
    total = mass.sum(-1, keepdim=True)
    return mass / torch.where(total > 0, total, 1.0)


def attention_stats(w: Tensor, queries: Tensor | None = None) -> AttentionStats:
    """The per-head sums of one batch of attention distributions w (B, H, T, T), rows over keys.

    ``queries`` (B, T) bool: the queries to count (real tokens); a query whose row is zero in any head (it
    sees no key) is never counted. Sums are float64.
    """
    w = w.detach().double()
    B, H, T, _ = w.shape
    counted = (w.sum(-1) > 0).all(1)  # (B, T)
    if queries is not None:
        counted = counted & queries.to(counted.device)
    pos = torch.arange(T, device=w.device)
    offset = pos[:, None] - pos[None, :]  # (T, T): i − j
    w = w * counted[:, None, :, None]  # (B, H, T, T): uncounted rows contribute nothing
    column = (offset + T - 1).flatten()  # (T·T,)
    by_offset = w.new_zeros(H, 2 * T - 1).index_add_(1, column, w.sum(0).flatten(1))  # (H, 2T − 1)
    per_pair = counted.sum(0)[:, None].expand(T, T).flatten().double()  # counted queries at (i, ·)
    return AttentionStats(
        distance=(w * offset.abs()).sum(-1).sum((0, 2)),  # Σ over keys, then over batch and queries: (H,)
        entropy=-torch.xlogy(w, w).sum(-1).sum((0, 2)),
        queries=counted.sum().double(),
        by_offset=by_offset,
        pairs=w.new_zeros(2 * T - 1).index_add_(0, column, per_pair),
    )


@dataclass
class Diagnostics:
    """What the hooks saw: per layer the statistics and one sample's attention map."""

    layers: list[AttentionStats | None]
    maps: list[Tensor | None] = field(default_factory=list)  # per layer (H, T, T), window 0
    signed: bool = False  # some weights were negative (numerator-mode RoPE): |w| was used
    weights_error: float = 0.0  # max |w @ v − output| / max |output|

    def measured(self) -> list[AttentionStats]:
        """Every layer's statistics: by the time they are read, the hooks have measured each layer."""
        missing = [i for i, s in enumerate(self.layers) if s is None]
        if missing:
            raise RuntimeError(f"layers {missing} were not measured: run the model with the diagnostics hooks first")
        return [s for s in self.layers if s is not None]

    def metrics(self) -> dict[str, float]:
        """``diag/mean_distance`` (tokens) and ``diag/entropy`` (nats), averaged over layers and heads."""
        return {  # each the mean of an (L, H) stack
            "diag/mean_distance": float(torch.stack([s.mean_distance for s in self.measured()]).mean()),
            "diag/entropy": float(torch.stack([s.mean_entropy for s in self.measured()]).mean()),
            "diag/weights_error": self.weights_error,
        }

    def files(self) -> dict[str, bytes | str]:
        return {
            "attention_stats.csv": csv_text(
                ["layer", "head", "mean_distance", "entropy", "queries"],
                (
                    [layer, head, f"{d:.6g}", f"{e:.6g}", int(s.queries)]
                    for layer, s in enumerate(self.measured())
                    for head, (d, e) in enumerate(zip(s.mean_distance.tolist(), s.mean_entropy.tolist(), strict=True))
                ),
            ),
            "attention_by_offset.csv": csv_text(  # column o of a profile over 2T − 1 offsets holds offset o − (T − 1)
                ["layer", "head", "offset", "mean_weight"],
                (
                    [layer, head, o - s.pairs.numel() // 2, f"{x:.6g}"]
                    for layer, s in enumerate(self.measured())
                    for head, row in enumerate(s.offset_profile.tolist())
                    for o, x in enumerate(row)
                    if not math.isnan(x)
                ),
            ),
            **draw(self),
        }


def attention_diagnostics(model, loader, windows: int = WINDOWS) -> Diagnostics:
    """Run ``model`` (a harness Transformer) on the first ``windows`` windows of ``loader`` in eval mode
    and collect every layer's implied attention through forward hooks on its variant."""
    variants = [block.attn.variant for block in model.blocks]
    diag = Diagnostics(layers=[None] * len(variants), maps=[None] * len(variants))
    handles = [v.register_forward_hook(_capture(diag, layer), with_kwargs=True) for layer, v in enumerate(variants)]
    was_training, device = model.training, next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad():
            for batch in _windows(loader, windows, model.cfg.n_heads):
                # .forward, not __call__: a compiled model (model.compile=true) runs eagerly here, hooks and all
                batch = on_device(batch, device)
                model.forward(batch["input_ids"], batch["key_padding_mask"], batch.get("document_ids"))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return diag


def _windows(loader, n: int, heads: int):
    """The loader's batches cut to ``n`` windows in all, in chunks of at most ``CHUNK_ELEMS`` weights per layer."""
    left = n
    for batch in loader:
        T = batch["input_ids"].shape[1]
        step = max(1, CHUNK_ELEMS // (heads * T * T))
        for start in range(0, min(left, len(batch["input_ids"])), step):
            yield {key: value[start : min(start + step, left)] for key, value in batch.items()}
        left -= min(left, len(batch["input_ids"]))
        if left == 0:
            return


def _capture(diag: Diagnostics, layer: int):
    def hook(variant, args, kwargs, output):
        given = inspect.signature(variant.forward).bind(*args, **kwargs).arguments  # q, k, v, ctx by name
        q, k, v, ctx = (given[name] for name in ("q", "k", "v", "ctx"))
        w = variant.implied_weights(q, k, ctx)  # (B, H, T, T)
        scale = output.abs().amax().clamp_min(torch.finfo(output.dtype).tiny)
        diag.weights_error = max(diag.weights_error, float((w @ v - output).abs().amax() / scale))
        diag.signed = diag.signed or bool((w < 0).any())
        p = as_distribution(w)
        stats = attention_stats(p, ctx.key_padding_mask)
        seen = diag.layers[layer]  # the batches before this one
        diag.layers[layer] = stats if seen is None else seen + stats
        if diag.maps[layer] is None:
            diag.maps[layer] = p[0].detach().float().cpu()  # (H, T, T)

    return hook


# ---------------------------------------------------------------- the figures

SIGNED_NOTE = "|w| renormalised per query: numerator-mode RoPE applies signed weights"


def draw(diag: Diagnostics) -> dict[str, bytes]:
    """Returns attention_{distance,entropy,by_offset,maps}.png."""
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
        "attention_by_offset.png": _by_offset(diag, T, note),
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


def _by_offset(diag: Diagnostics, T: int, note: list[str]) -> bytes:
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
