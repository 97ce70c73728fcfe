"""Datasets over a token stream: random training windows, fixed evaluation windows.

Every example is a pure function of (seed, index), so data order and masks are
reproducible across runs, resumes and DDP ranks.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from harness.data.corpus import check_train_split, check_val_split


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class TrainWindows(Dataset):
    """``n`` windows of ``length`` tokens at uniformly random offsets."""

    def __init__(self, ids: np.ndarray, length: int, n: int, seed: int, objective):
        check_train_split(len(ids), length)
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
        check_val_split(len(ids), objective.extra_tokens)
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


class ContinueFrom(DistributedSampler):
    """This rank's training indices, in order: rank r of W reads start + r, start + r + W, … < n.

    In order, because examples are pure functions of (seed, index): the B × W examples of a global
    batch are then exactly those one process reads at batch B × W, and a resumed run continues at
    ``start`` = optimizer step × batch × accumulation × W. The length stays n / W: Lightning's
    restored progress counters already count the batches before ``start`` as done in this epoch.
    Being a DistributedSampler, Lightning leaves it alone (it would inject a shuffling one).
    """

    def __init__(self, dataset: Dataset, start: int = 0, rank: int = 0, world_size: int = 1):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False, drop_last=True)
        self.start = start

    def __len__(self) -> int:
        return len(self.dataset) // self.num_replicas

    def __iter__(self):
        end = len(self) * self.num_replicas
        return iter(range(self.start + self.rank, end, self.num_replicas))
