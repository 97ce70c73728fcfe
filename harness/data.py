"""Datasets over a token stream: random training windows, fixed evaluation windows.

Every example is a pure function of (seed, index), so data order and masks are
reproducible across runs, resumes and DDP ranks.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class TrainWindows(Dataset):
    """``n`` windows of ``length`` tokens at uniformly random offsets."""

    def __init__(self, ids: np.ndarray, length: int, n: int, seed: int, objective):
        if len(ids) <= length:
            raise ValueError(f"training split has {len(ids)} tokens, fewer than one window of {length}")
        self.ids, self.length, self.n, self.seed, self.objective = ids, length, n, seed, objective

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = _generator(self.seed, index)
        start = int(torch.randint(len(self.ids) - self.length + 1, (1,), generator=gen))
        window = torch.from_numpy(self.ids[start : start + self.length].astype(np.int64))
        return self.objective.make_example(window, torch.ones(self.length, dtype=torch.bool), gen)


class EvalWindows(Dataset):
    """Consecutive windows covering the split once; the last one is padded.

    The masking seed is fixed per window, so every evaluation scores the same tokens.
    """

    def __init__(self, ids: np.ndarray, length: int, objective, pad_id: int, seed: int = 12345):
        self.ids, self.length, self.objective, self.pad_id, self.seed = ids, length, objective, pad_id, seed
        stride = length - objective.extra_tokens  # CLM windows overlap by the one shifted token
        self.starts = list(range(0, max(len(ids) - objective.extra_tokens, 1), stride))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        chunk = torch.from_numpy(self.ids[self.starts[index] : self.starts[index] + self.length].astype(np.int64))
        window = torch.full((self.length,), self.pad_id, dtype=torch.long)
        window[: len(chunk)] = chunk
        valid = torch.arange(self.length) < len(chunk)
        return self.objective.make_example(window, valid, _generator(self.seed, index))


def make_loaders(corpus, tokenizer, objective, seq_len: int, batch_size: int, n_train: int, seed: int,
                 eval_batches: int | None = None, world_size: int = 1,
                 sampler: Callable[[Dataset, bool], Sampler | None] = lambda dataset, train: None,
                 ) -> tuple[DataLoader, DataLoader]:
    """``batch_size`` and ``eval_batches`` are per device: with DDP the validation subset holds
    eval_batches × batch_size × world_size windows, the same set a single process scores at the same
    global batch. ``sampler(dataset, train)`` gives this rank's share (None: all of it)."""
    length = seq_len + objective.extra_tokens
    train = TrainWindows(tokenizer.encode(corpus.train), length, n_train, seed, objective)
    val = EvalWindows(tokenizer.encode(corpus.val), length, objective, tokenizer.pad_id)
    if eval_batches is not None:
        val = torch.utils.data.Subset(val, range(min(len(val), eval_batches * batch_size * world_size)))
    return (DataLoader(train, batch_size=batch_size, shuffle=False, sampler=sampler(train, True)),
            DataLoader(val, batch_size=batch_size, shuffle=False, sampler=sampler(val, False)))
