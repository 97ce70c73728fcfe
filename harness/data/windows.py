"""Datasets over a token stream: random (or sequential) training windows, each DDP rank in its own slice of the
tokens, and fixed evaluation windows.

Every example is a pure function of (seed, index), so data order and masks are
reproducible across runs, resumes and DDP ranks.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

from harness.data.corpus import check_train_split, check_val_split

IGNORE = -100  # PyTorch's ignore_index: no prediction scored here


SPACING = 1_000_003  # seed s's first SPACING examples draw from seeds s·SPACING + index, disjoint across seeds


def _generator(seed: int, index: int) -> torch.Generator:
    """Example ``index``'s generator. A seed's first SPACING indices use seed·SPACING + index, distinct for every
    seed; past them that sum is the next seed's (seed s's index SPACING + j is seed s + 1's index j: the same window and
    masks), so a longer run (a paper-scale one reads millions of windows) hashes (seed, index) instead, into the upper
    half of the 64-bit seeds, which no sum reaches."""
    if index < SPACING:
        return torch.Generator().manual_seed(seed * SPACING + index)
    state = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(1 << 63 | (int(state[0]) << 32 | int(state[1])) >> 1)


def with_document_ids(
    example: dict[str, torch.Tensor], firsts: np.ndarray | None, start: int, length: int
) -> dict[str, torch.Tensor]:
    """``example`` with ``document_ids`` (T,) when the source passes documents: ``firsts`` (bool, one per token of
    the split) is True at each document's first token. The window's first token is in document 0 whatever it is;
    padding beyond the split continues the last document (masked anyway). None: the example as it was."""
    if firsts is None:
        return example
    window = np.zeros(length, dtype=np.int64)
    chunk = firsts[start + 1 : start + length]  # after the window's first token, in document 0 whatever it is
    window[1 : 1 + len(chunk)] = chunk
    ids = torch.from_numpy(np.cumsum(window))
    return {**example, "document_ids": ids[: example["input_ids"].shape[0]]}  # CLM: its inputs are window[:-1]


def rank_slice(n_tokens: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of the training tokens rank ``rank`` of ``world_size`` reads: W contiguous, disjoint slices
    covering all ``n_tokens``, their sizes differing by at most one token."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    return n_tokens * rank // world_size, n_tokens * (rank + 1) // world_size


class TrainWindows(Dataset):
    """``n`` windows of ``length`` tokens; example g lies in rank (g mod W)'s ``rank_slice`` (one rank: all ids).

    random: a uniform start in the slice, drawn from (seed, g); sequential (pre-tokenized shards'
    ``data.windows``): the (g div W)-th window of the slice, windows advancing ``stride`` tokens and wrapping around.
    """

    def __init__(
        self,
        ids,
        length: int,
        n: int,
        seed: int,
        objective,
        firsts: np.ndarray | None = None,
        windows: str = "random",
        world_size: int = 1,
        stride: int | None = None,
    ):
        """``firsts``: True at each document's first token (``with_document_ids``), or None."""
        self.ids, self.length, self.n, self.seed, self.objective, self.firsts = ids, length, n, seed, objective, firsts
        self.windows, self.world_size, self.stride = windows, world_size, stride or length
        self.slices = [rank_slice(len(ids), r, world_size) for r in range(world_size)]
        check_train_split(min(end - start for start, end in self.slices), length)  # every rank's slice holds one

    def __len__(self) -> int:
        return self.n

    def start(self, index: int, gen: torch.Generator) -> int:
        """Where example ``index`` starts (random: drawn from ``gen``, which then goes on to the objective)."""
        lo, hi = self.slices[index % self.world_size]
        if self.windows == "random":
            return lo + int(torch.randint(hi - lo - self.length + 1, (1,), generator=gen))
        per_slice = (hi - lo - self.length) // self.stride + 1
        return lo + (index // self.world_size) % per_slice * self.stride

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = _generator(self.seed, index)
        start = self.start(index, gen)
        window = torch.from_numpy(np.asarray(self.ids[start : start + self.length]).astype(np.int64))
        example = self.objective.make_example(window, torch.ones(self.length, dtype=torch.bool), gen)
        return with_document_ids(example, self.firsts, start, self.length)


def window_starts(n_labels: int, length: int, stride: int) -> list[int]:
    """Where windows of ``length`` scored positions start when each advances ``stride`` tokens, until
    one reaches the last of ``n_labels`` labels (YaRN's eval/perplexity.py; Press et al. 2022, App. B's
    sliding evaluation). stride = length gives the non-overlapping windows that cover the split once."""
    return list(range(0, window_count(n_labels, length, stride) * stride, stride))


def window_count(n_labels: int, length: int, stride: int) -> int:
    """``len(window_starts(n_labels, length, stride))`` without listing them (a cost check's count): the first
    window and one more per ``stride`` until one reaches the last label."""
    return 1 + max(0, -(-(n_labels - length) // stride))


class EvalWindows(Dataset):
    """Windows at fixed ``starts`` (default: consecutive, covering the split once; the last one padded).

    ``score_from[k]``: window k scores only its labels from that index on (earlier ones are context):
    a sliding window scores the tokens the previous one did not reach, a same-targets window only its
    last K. The masking seed is fixed per window, so every evaluation scores the same tokens.
    """

    def __init__(
        self,
        ids: np.ndarray,
        length: int,
        objective,
        pad_id: int,
        seed: int = 12345,
        starts: list[int] | None = None,
        score_from: list[int] | None = None,
        firsts: np.ndarray | None = None,
    ):
        check_val_split(len(ids), objective.extra_tokens)
        self.ids, self.length, self.objective, self.pad_id, self.seed = ids, length, objective, pad_id, seed
        self.firsts = firsts  # True at each document's first token (``with_document_ids``), or None
        labels = length - objective.extra_tokens  # CLM windows overlap by the one shifted token
        self.starts = starts if starts is not None else window_starts(len(ids) - objective.extra_tokens, labels, labels)
        self.score_from = score_from or [0] * len(self.starts)

    @classmethod
    def sliding(
        cls, ids: np.ndarray, length: int, stride: int, objective, pad_id: int, firsts: np.ndarray | None = None
    ) -> EvalWindows:
        """Windows advancing ``stride`` tokens; each after the first scores only its last ``stride`` labels."""
        labels = length - objective.extra_tokens
        starts = window_starts(len(ids) - objective.extra_tokens, labels, stride)
        score_from = [0] + [labels - stride] * (len(starts) - 1)  # window k > 0: its last S labels are new
        return cls(ids, length, objective, pad_id, starts=starts, score_from=score_from, firsts=firsts)

    @classmethod
    def last_tokens(
        cls,
        ids: np.ndarray,
        length: int,
        ends: list[int],
        keep: int,
        objective,
        pad_id: int,
        firsts: np.ndarray | None = None,
    ) -> EvalWindows:
        """One window per sample ending at label index ``ends[j]`` (exclusive), scoring its last ``keep``
        labels: at every context length the same targets (Kazemnejad et al. 2023, App. F.3)."""
        labels = length - objective.extra_tokens
        return cls(
            ids,
            length,
            objective,
            pad_id,
            starts=[e - labels for e in ends],
            score_from=[labels - keep] * len(ends),
            firsts=firsts,
        )

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        chunk = torch.from_numpy(self.ids[self.starts[index] : self.starts[index] + self.length].astype(np.int64))
        window = torch.full((self.length,), self.pad_id, dtype=torch.long)
        window[: len(chunk)] = chunk
        valid = torch.arange(self.length) < len(chunk)
        example = self.objective.make_example(window, valid, _generator(self.seed, index))
        example["labels"][: self.score_from[index]] = IGNORE  # context only: scored by an earlier window
        return with_document_ids(example, self.firsts, self.starts[index], self.length)


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
        self.start = start  # the length is DistributedSampler's: n // W, with drop_last

    def __iter__(self):
        return iter(range(self.start + self.rank, len(self) * self.num_replicas, self.num_replicas))
