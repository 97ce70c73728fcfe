"""Passkey retrieval: a 5-digit key hidden at a random depth in corpus text; accuracy by length and depth
(``passkey_depth.csv`` and ``.png``, the run's artifacts)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask, TaskResults, ascii_ids
from harness.errors import ConfigError
from harness.markdown import csv_text

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = " What is the pass key? The pass key is "
DIGITS = 5
FIXED = len(NEEDLE.format(key="0" * DIGITS)) + len(QUESTION) + DIGITS  # tokens besides the filler
MIN_FILLER = 20  # ≥ 20 filler bytes: depth steps of ≤ 5 %, so every 10 % depth bin can be drawn


def _depth_bin(depth, n_bins: int):
    """The bin of a depth in percent (0 … 100; an int or an integer array): equal-width bins, 100 % in the last."""
    return np.minimum(np.asarray(depth) * n_bins // 100, n_bins - 1)


class Passkey(SyntheticTask):
    """Passkey retrieval of Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite
    Context Length for Transformers", the test that position interpolation (Chen et al. 2023) and
    YaRN (Peng et al. 2023) use for extended contexts.

    Layout (length = the model's sequence length in tokens):
        <filler[:b]> The pass key is 12345. Remember it. 12345 is the pass key. <filler[b:]>
         What is the pass key? The pass key is 12345
    scored on the final 5 digits only (exact match: all five). Their needle and question sentences
    are kept verbatim; their filler ("The grass is green. The sky is blue. …" repeated) is replaced
    by a contiguous stretch of corpus text (``filler=corpus.train`` for training, ``corpus.val`` for
    evaluation), and their opening instruction sentence is dropped (it only adds tokens). Unlike
    the papers' zero-shot use, the model here is trained on short contexts (``train_lengths``) and
    tested on longer ones. The key is uniform in 10000–99999.

    Depth: ``b`` filler bytes precede the needle out of F, and the example's ``depth`` field is
    ⌊100·b/F⌋ percent. Training draws b uniformly; evaluation example i draws it uniformly inside
    depth bin i mod ``depth_bins``, so every (length, depth bin) cell holds the same count.
    """

    needs_filler = True

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        train_lengths=(128, 256),
        eval_lengths=(128, 256, 512, 1024),
        eval_examples: int = 100,
        depth_bins: int = 10,
    ):
        super().__init__(tokenizer, form, train_lengths, eval_lengths, eval_examples)
        if isinstance(depth_bins, bool) or not isinstance(depth_bins, int) or not 1 <= depth_bins <= 10:
            raise ConfigError(
                f"task.depth_bins={depth_bins!r} must be an integer in 1..10 (depths have percent "
                "resolution over ≥ 20 filler bytes), e.g. 10"
            )
        self.depth_bins = depth_bins

    def min_length(self) -> int:
        return FIXED + MIN_FILLER - (1 if self.causal else 0)  # the length whose layout holds MIN_FILLER

    def layout_size(self, length: int) -> int:
        return length + 1 if self.causal else length  # length counts the model's tokens

    def filler_size(self, length: int) -> int:
        """F: filler bytes in a ``length`` example."""
        return self.layout_size(length) - FIXED

    def check_filler(self, filler: Tensor | None, longest: int) -> None:
        filler = self.given_filler(filler)
        if len(filler) < self.filler_size(longest):
            raise ConfigError(
                f"the filler text holds {len(filler)} bytes, fewer than the {self.filler_size(longest)} "
                f"a passkey example of length {longest} needs; use a larger corpus or shorter lengths"
            )

    def layout(
        self,
        length: int,
        gen: torch.Generator,
        filler: Tensor | None = None,
        depth_range: tuple[int, int] | None = None,
    ) -> Layout:
        """``depth_range``: the insertion points b to draw from (default: all 0 … F)."""
        filler = self.given_filler(filler)
        F = self.filler_size(length)
        lo, hi = depth_range if depth_range is not None else (0, F)
        b = lo + int(torch.randint(hi - lo + 1, (1,), generator=gen))
        start = int(torch.randint(len(filler) - F + 1, (1,), generator=gen))
        text = filler[start : start + F].long()
        key = str(10_000 + int(torch.randint(90_000, (1,), generator=gen)))
        tokens = torch.cat([text[:b], ascii_ids(NEEDLE.format(key=key)), text[b:], ascii_ids(QUESTION + key)])
        return Layout(tokens, torch.arange(len(tokens)) >= len(tokens) - DIGITS, {"depth": 100 * b // F})

    def example(
        self, length: int, gen: torch.Generator, filler: Tensor | None = None, index: int | None = None
    ) -> dict:
        if index is None:  # training: any depth
            return super().example(length, gen, filler)
        F = self.filler_size(length)
        points = np.arange(F + 1)
        # _depth_bin is non-decreasing in b, so one bin's insertion points are a contiguous range
        inside = points[_depth_bin(100 * points // F, self.depth_bins) == index % self.depth_bins]
        return self.finish(self.layout(length, gen, filler, depth_range=(int(inside[0]), int(inside[-1]))), length)

    def artifacts(self, results: TaskResults) -> dict[str, bytes]:
        """``passkey_depth.csv`` and ``passkey_depth.png``: exact match by length × depth bin (none when
        every length was skipped)."""
        records = [(e.length, e.extras["depth"], e.correct) for e in results.examples]
        if not records:
            return {}
        return depth_files(records, self.depth_bins)


# --- accuracy by (length, depth) ---------------------------------------------------------------


@dataclass(frozen=True)
class DepthTable:
    """Exact-match counts per (depth bin, length): rows are bins (0 % first), columns lengths."""

    lengths: tuple[int, ...]
    n_bins: int
    total: np.ndarray  # (n_bins, n_lengths) examples
    correct: np.ndarray  # (n_bins, n_lengths) exact matches

    @property
    def accuracy(self) -> np.ndarray:
        """(n_bins, n_lengths); NaN where a cell holds no example."""
        return np.where(self.total > 0, self.correct / np.maximum(self.total, 1), np.nan)

    def bin_label(self, k: int) -> tuple[int, int]:
        """Bin k's depth range in percent, [lo, hi)."""
        return 100 * k // self.n_bins, 100 * (k + 1) // self.n_bins


def depth_table(records: Iterable[tuple[int, int, bool]], n_bins: int = 10) -> DepthTable:
    """Counts of per-example (length, depth %, correct) records, e.g. zipped from a batch's
    ``length`` and ``depth`` fields and ``exact_match``."""
    rows = np.array([(int(n), int(d), bool(c)) for n, d, c in records], dtype=np.int64).reshape(-1, 3)  # (E, 3)
    lengths, column = np.unique(rows[:, 0], return_inverse=True)
    cell = (_depth_bin(rows[:, 1], n_bins), column)  # (E,) bins, (E,) length columns
    total, correct = np.zeros((2, n_bins, len(lengths)), dtype=np.int64)
    np.add.at(total, cell, 1)
    np.add.at(correct, cell, rows[:, 2])
    return DepthTable(tuple(lengths.tolist()), n_bins, total, correct)


def depth_files(records: Iterable[tuple[int, int, bool]], n_bins: int = 10) -> dict[str, bytes]:
    """``passkey_depth.csv`` (length, depth_lo, depth_hi, n, correct, accuracy) and ``passkey_depth.png``
    (heatmap: length across, depth down, as in the needle-in-a-haystack plots), name -> bytes."""
    table = depth_table(records, n_bins)
    png = io.BytesIO()
    _heatmap(table, png)
    text = csv_text(
        ["length", "depth_lo", "depth_hi", "n", "correct", "accuracy"],
        (
            [length, *table.bin_label(k), table.total[k, j], table.correct[k, j], "" if np.isnan(a) else f"{a:.6f}"]
            for j, length in enumerate(table.lengths)
            for k, a in enumerate(table.accuracy[:, j])
        ),
    )
    return {"passkey_depth.csv": text.encode(), "passkey_depth.png": png.getvalue()}


def _heatmap(table: DepthTable, out: BinaryIO) -> None:
    import matplotlib
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global figures

    acc = table.accuracy
    fig = Figure(figsize=(1.0 + 0.8 * len(table.lengths), 1.2 + 0.35 * table.n_bins))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")  # grey: cells without examples
    im = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for (k, j), a in np.ndenumerate(acc):
        ax.text(j, k, "–" if np.isnan(a) else f"{a:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(table.lengths)), [str(n) for n in table.lengths])
    ax.set_yticks(range(table.n_bins), [f"{lo}–{hi} %" for lo, hi in map(table.bin_label, range(table.n_bins))])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("key depth")
    ax.set_title("passkey exact match")
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(out, dpi=120, format="png")
