"""The data loaders of a run, for any task: training examples in a resumable order, and validation
examples paired with their shuffled twins (the position-usage check).

A task (harness/data/objectives.py for text, harness/data/tasks/ for synthetic tasks) supplies the
datasets and its collate; this module adds what every run shares: ``ContinueFrom`` (resume, DDP
shards), the validation subset and shards, and ``WithShuffled``: each validation example comes with
the same example with its token order permuted inside the window, from a generator seeded by the example's index,
so every validation scores the same shuffled text and ``val/order_gain`` = shuffled loss − plain loss (nats per
token) measures how much the model uses word order: a model that uses it loses accuracy when it is permuted.

- Masked LM and encoder-form tasks (labels aligned with inputs): ``shuffle_within_window`` moves
  inputs and labels by one permutation, so a masked target travels with its [MASK] slot.
- Causal LM: the *raw window* is permuted before the input/label shift (as if its real tokens were put
  in ``real_permutation``'s order, then ``CausalLM.make_example``): the targets are the next tokens of the
  permuted text. ``shuffle_within_window(..., causal=True)`` does this on a built example (a text window or a
  causal synthetic task's): it rebuilds the raw text, permutes it, shifts again, and each scored target token
  keeps its score wherever it lands (the token landing at position 0 cannot be predicted).

Padding never moves: only real positions are permuted among themselves. In packed windows (``document_ids``)
each document's among themselves: with attention kept inside documents, a permutation across them would change what
each document holds, a loss change that even a model blind to order shows.

Notation: T sequence length.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset
from torch.utils.data.dataloader import default_collate

from harness.data.windows import IGNORE, ContinueFrom
from harness.errors import ConfigError, WorkerConfigError

SHUFFLE_SEED = 7919  # the permutation of validation example i is drawn from SHUFFLE_SEED + i


class Examples(Protocol):
    """A task's dataset: example i by index, and how many there are (torch's ``Dataset`` declares no length)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict: ...


class WithShuffled(Dataset):
    """{"plain": example i, "shuffled": example i with its real tokens permuted}."""

    def __init__(self, dataset: Examples, causal: bool):
        self.dataset, self.causal = dataset, causal

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        example = self.dataset[index]
        gen = torch.Generator().manual_seed(SHUFFLE_SEED + index)
        return {"plain": example, "shuffled": shuffle_within_window(example, gen, causal=self.causal)}


def real_permutation(valid: Tensor, gen: torch.Generator, documents: Tensor | None = None) -> Tensor:
    """(T,) bool -> (T,) long index map: a uniform permutation of the real positions; padding maps to itself.
    ``documents``: (T,) document ids; each document's real positions are permuted among themselves."""
    index = torch.arange(len(valid))
    groups = [valid] if documents is None else [valid & (documents == d) for d in documents.unique()]
    for group in groups:
        real = group.nonzero().squeeze(1)
        index[real] = real[torch.randperm(len(real), generator=gen)]
    return index


def shuffle_within_window(example: dict[str, Tensor], gen: torch.Generator, causal: bool = False) -> dict:
    """The example with its real tokens permuted; other fields unchanged. See the module docstring."""
    if causal:
        return {**example, **_shuffle_causal(example, gen)}
    perm = real_permutation(example["key_padding_mask"], gen, example.get("document_ids"))
    return {**example, "input_ids": example["input_ids"][perm], "labels": example["labels"][perm]}


def _shuffle_causal(example: dict[str, Tensor], gen: torch.Generator) -> dict[str, Tensor]:
    inputs, labels, valid = example["input_ids"], example["labels"], example["key_padding_mask"]
    n = int(valid.sum())
    if not torch.equal(valid, torch.arange(len(valid)) < n):
        raise ValueError("a causal example's real tokens must come first (right padding)")
    # raw text: the n inputs, plus the final target when it is scored (it is no input)
    last = labels[n - 1 : n]
    raw = torch.cat([inputs[:n], last[last != IGNORE]])  # (r,)
    scored = torch.cat([torch.zeros(1, dtype=torch.bool), labels[: len(raw) - 1] != IGNORE])  # (r,) raw[t] scored
    documents = example.get("document_ids")
    if documents is not None:  # (r,) the final target counted in the last input's document
        documents = torch.cat([documents[:n], documents[n - 1 : n]])[: len(raw)]
    perm = real_permutation(torch.ones(len(raw), dtype=torch.bool), gen, documents)
    raw, scored = raw[perm], scored[perm]
    new_inputs, new_labels = inputs.clone(), torch.full_like(labels, IGNORE)
    new_inputs[:n] = raw[:n]
    new_labels[: len(raw) - 1] = torch.where(scored[1:], raw[1:], IGNORE)
    return {"input_ids": new_inputs, "labels": new_labels}


class OneLineErrors(Dataset):
    """A training dataset read by worker processes: its refusals (``ConfigError``) reach the run as their one line
    (``WorkerConfigError``), not as torch's text of the worker's traceback."""

    def __init__(self, dataset: Examples):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        try:
            return self.dataset[index]
        except ConfigError as e:
            raise WorkerConfigError(e) from None


def _pair_collate(collate, items: list[dict]) -> dict:
    """Collates the plain and the shuffled halves of a validation batch apart (bound with ``functools.partial``:
    picklable)."""
    return {part: collate([item[part] for item in items]) for part in ("plain", "shuffled")}


def make_loaders(
    corpus,
    task,
    seq_len: int,
    batch_size: int,
    n_train: int,
    seed: int,
    eval_batches: int | None = None,
    world_size: int = 1,
    rank: int = 0,
    start: int = 0,
    num_workers: int = 0,
) -> tuple[DataLoader, DataLoader]:
    """``batch_size`` and ``eval_batches`` are per device: with DDP the validation subset holds
    eval_batches × batch_size × world_size examples, the same set a single process scores at the same
    global batch, split into disjoint shards. ``start``: the first training example (resuming).
    ``num_workers``: training worker processes; an example is a pure function of its index, so they change
    how fast examples come, not which."""
    per_rank = {"world_size": world_size} if getattr(corpus, "per_rank", False) else {}  # shards: a slice per rank
    train = task.training_data(corpus, seq_len, n_train, seed, **per_rank)
    paired = WithShuffled(task.validation_data(corpus, seq_len), task.causal)
    val: Dataset = (
        paired
        if eval_batches is None
        else Subset(paired, range(min(len(paired), eval_batches * batch_size * world_size)))
    )
    # shards without DistributedSampler's padding repeats, so the summed val loss counts each example once; Lightning
    # imported only then: the bench room's memory children build a model from this package and never a process group
    val_sampler = None
    if world_size > 1:
        from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

        val_sampler = UnrepeatedDistributedSampler(val, num_replicas=world_size, rank=rank, shuffle=False)
    # Each loader draws its iterator's base seed from its own generator: from the global one,
    # every validation pass would shift the dropout stream, and a resumed run (which does not
    # repeat the validation at its checkpoint step) would draw different dropout masks.
    return (
        DataLoader(
            OneLineErrors(train) if num_workers else train,
            batch_size=batch_size,
            sampler=ContinueFrom(train, start, rank, world_size),
            collate_fn=task.collate,
            generator=torch.Generator().manual_seed(seed),
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
        ),
        DataLoader(
            val,
            batch_size=batch_size,
            shuffle=False,
            sampler=val_sampler,
            collate_fn=functools.partial(_pair_collate, task.collate or default_collate),
            generator=torch.Generator().manual_seed(seed),
        ),
    )


def without_full_masks(batch: dict) -> dict:
    """``batch`` with a key_padding_mask that masks nothing replaced by None (validation's pairs of batches
    too), decided where the batch is collated, on the host: the model never reads a tensor's value, which
    on a GPU would wait for every queued kernel, and attention given no mask builds and applies none."""
    if "key_padding_mask" not in batch:
        return {k: without_full_masks(v) if isinstance(v, dict) else v for k, v in batch.items()}
    mask, documents = batch["key_padding_mask"], batch.get("document_ids")
    if mask is not None and bool(mask.all()):
        batch = {**batch, "key_padding_mask": None}
    if documents is not None and bool((documents == documents[:, :1]).all()):  # one document a row: nothing to do
        batch = {**batch, "document_ids": None}
    return batch


def on_device(batch: dict, device) -> dict:
    """A collated batch on ``device``, without a mask that masks nothing (``without_full_masks``)."""
    return {k: None if v is None else v.to(device) for k, v in without_full_masks(batch).items()}
