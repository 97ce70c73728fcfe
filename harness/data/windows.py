"""Datasets over a token stream: random training windows, fixed evaluation windows.

Every example is a pure function of (seed, index), so data order and masks are
reproducible across runs, resumes and DDP ranks.
"""

from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler

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


def make_loaders(corpus, tokenizer, objective, seq_len: int, batch_size: int, n_train: int, seed: int,
                 eval_batches: int | None = None, world_size: int = 1, rank: int = 0,
                 start: int = 0) -> tuple[DataLoader, DataLoader]:
    """``batch_size`` and ``eval_batches`` are per device: with DDP the validation subset holds
    eval_batches × batch_size × world_size windows, the same set a single process scores at the same
    global batch, split into disjoint shards. ``start``: the first training example (resuming)."""
    length = seq_len + objective.extra_tokens
    train = TrainWindows(tokenizer.encode(corpus.train), length, n_train, seed, objective)
    val = EvalWindows(tokenizer.encode(corpus.val), length, objective, tokenizer.pad_id)
    if eval_batches is not None:
        val = torch.utils.data.Subset(val, range(min(len(val), eval_batches * batch_size * world_size)))
    # Shards without DistributedSampler's padding repeats, so the summed val loss counts each window once.
    val_sampler = UnrepeatedDistributedSampler(val, num_replicas=world_size, rank=rank, shuffle=False) \
        if world_size > 1 else None
    # Each loader draws its iterator's base seed from its own generator: from the global one,
    # every validation pass would shift the dropout stream, and a resumed run (which does not
    # repeat the validation at its checkpoint step) would draw different dropout masks.
    return (DataLoader(train, batch_size=batch_size, sampler=ContinueFrom(train, start, rank, world_size),
                       generator=torch.Generator().manual_seed(seed)),
            DataLoader(val, batch_size=batch_size, shuffle=False, sampler=val_sampler,
                       generator=torch.Generator().manual_seed(seed)))
