"""What every synthetic task shares: forms, length ranges, datasets, padding and exact match.

A task builds one ``Layout`` per example — the whole byte string with the answer tokens flagged —
and its *form* turns it into model inputs and labels:

- ``causal`` (decoder-only; Kazemnejad et al. 2023): inputs are the string but its last token,
  labels the next token where that token is an answer, -100 elsewhere;
- ``encoder`` (bidirectional; Ruoss et al. 2023): answer tokens are replaced by [MASK] input
  slots and scored there; the prompt is never scored.

Every example is a pure function of (seed, split, length, index) through its own torch.Generator,
as in harness/data/windows.py: the same across runs, resumes and DDP ranks.

The final evaluation (harness/model/evaluate.py) scores each ``eval_lengths`` entry and hands the
per-example outcomes (``TaskResults``) to the task's ``artifacts`` hook: the files it attaches to the
run (passkey's accuracy by depth). A task is one module here, named as its conf/task/<name>.yaml.

Notation: N layout length, T model sequence length (N - 1 causal, N encoder), B batch, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from harness.data.objectives import IGNORE, Task
from harness.data.tasks.blind import Blind
from harness.data.tokenizer import ByteTokenizer
from harness.errors import ConfigError

PRINTABLE = range(0x21, 0x7F)  # printable ASCII without space: one byte, one token, readable when decoded
EVAL_SEED = 12345  # one fixed evaluation set for every run, seed and cell, so accuracies compare
TRAIN, EVAL = 0, 1  # generator streams: an evaluation example never repeats a training example's draws
FORM_FIELDS = ("input_ids", "labels", "key_padding_mask")  # (T,) each; an example's other fields are ints


def _example_generator(seed: int, stream: int, length: int, index: int) -> torch.Generator:
    """The generator of one example: SeedSequence hashes the tuple, so no two tuples share a stream."""
    state = np.random.SeedSequence([seed, stream, length, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def ascii_ids(text: str) -> Tensor:
    """(len(text),) long byte ids of an ASCII string."""
    return torch.tensor(list(text.encode("ascii")), dtype=torch.long)


def symbols(key: str, text, reserved: str = "") -> Tensor:
    """A task alphabet from config: ≥ 2 distinct printable ASCII characters, none of ``reserved``."""
    if not isinstance(text, str) or len(text) < 2 or len(set(text)) != len(text):
        raise ConfigError(f"{key}={text!r} must be a string of at least 2 distinct characters, e.g. {key}=abcd")
    bad = sorted({c for c in text if ord(c) not in PRINTABLE or c in reserved})
    if bad:
        raise ConfigError(
            f"{key}={text!r} contains {''.join(bad)!r}: use printable ASCII other than space and "
            f"the task's separators {reserved!r}"
        )
    return ascii_ids(text)


@dataclass(frozen=True)
class Layout:
    """One example before its form: the full string and which of its tokens are answers."""

    tokens: Tensor  # (N,) long byte ids
    answer: Tensor  # (N,) bool, True at the tokens the model must produce
    extras: dict[str, int] = field(default_factory=dict)  # per-example ints (e.g. passkey depth)


def exact_match(logits: Tensor, labels: Tensor) -> Tensor:
    """(B, T, V), (B, T) -> (B,) bool: a sequence is right only if every scored position's argmax is.

    Under teacher forcing this equals greedy decoding's exact match (Kazemnejad et al. 2023 score
    greedy outputs): while every earlier answer token is predicted right, the greedy prefix *is* the
    teacher-forced prefix, so the first wrong argmax is where greedy decoding would go wrong too.
    """
    scored = labels != IGNORE
    if not scored.any(dim=1).all():
        raise ValueError("exact_match: a sequence has no scored position (labels all -100)")
    return ((logits.argmax(dim=-1) == labels) | ~scored).all(dim=1)


def token_hits(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T, V), (B, T) -> (right, scored): how many scored positions' argmax is the target, and how many
    are scored, summed over the batch. Their ratio is per-token accuracy, the metric of Ruoss et al. 2023
    (the mean over output tokens of argmax == target; DeepMind's neural_networks_chomsky_hierarchy
    ``tasks/task.py`` accuracy_fn), which separates models whose exact match is 0 at every length."""
    scored = labels != IGNORE
    return ((logits.argmax(dim=-1) == labels) & scored).sum(), scored.sum()


def string_hits(logits: Tensor, labels: Tensor) -> Tensor:
    """(B, T, V), (B, T) -> (B,): the share of each sequence's expected strings (maximal runs of scored positions)
    with every position's argmax right — RULER's ``string_match_all`` under teacher forcing (harness/data/tasks/
    ruler.py); exact match is this share being 1."""
    scored = labels != IGNORE
    starts = scored & ~torch.nn.functional.pad(scored, (1, 0))[:, :-1]
    run = starts.cumsum(dim=1) * scored  # (B, T): 1, 2, … per string, 0 elsewhere
    wrong = torch.zeros(labels.shape[0], labels.shape[1] + 1).scatter_add_(
        1, run, ((logits.argmax(dim=-1) != labels) & scored).float()
    )
    return 1 - (wrong[:, 1:] > 0).sum(dim=1) / starts.sum(dim=1).clamp(min=1)


@dataclass(frozen=True)
class ScoredExample:
    """One evaluation example's outcome."""

    length: int  # the task's own length
    correct: bool  # exact match
    extras: dict[str, int]  # the task's per-example ints (``Layout.extras``, e.g. passkey's depth)


@dataclass
class TaskResults:
    """The final model's evaluation at each ``eval_lengths`` entry."""

    accuracy: dict[int, float] = field(default_factory=dict)  # exact-match accuracy per task length
    token_accuracy: dict[int, float] = field(default_factory=dict)  # right answer tokens ÷ answer tokens
    losses: dict[int, float] = field(default_factory=dict)  # nats per answer token
    strings: dict[int, float] = field(default_factory=dict)  # share of expected strings right (``partial_credit``)
    skipped: dict[int, str] = field(default_factory=dict)  # length -> why it was not scored (the scheme refused)
    examples: list[ScoredExample] = field(default_factory=list)  # every scored example, in evaluation order
    blind: dict[int, Blind] = field(default_factory=dict)  # length -> the position-blind baseline, where defined


@runtime_checkable
class ScoredTask(Task, Protocol):
    """A task scored by exact match per sequence (``scores_sequences``): what harness/model/evaluate.py and
    harness/train.py call on it beyond ``Task``. ``SyntheticTask`` implements it."""

    eval_lengths: tuple[int, ...]

    def length_data(self, corpus, length: int) -> Dataset:
        """The evaluation set at one length: ``val/acc_at_<length>``."""

    def artifacts(self, results: TaskResults) -> dict[str, bytes]:
        """Files (name -> bytes) attached to the MLflow run when training ends, from the final evaluation."""


def _int_list(key: str, value) -> list[int]:
    """A config list (list, tuple or OmegaConf ListConfig) of plain integers."""
    items = None if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__") else list(value)
    if items is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ConfigError(f"{key}={value!r} must be a list of integers, e.g. {key}=[1,20]")
    return items


class SyntheticTask:
    """Base class. A task's *length* is its own size parameter (the string length |w|, the number of
    key–value pairs, the passkey context in tokens); ``tokens_for(length)`` converts it to tokens.

    Subclasses set ``forms`` (the forms their papers define; the first is the default), and implement
    ``layout_size`` and ``layout``; ``min_length``/``max_length`` bound the lengths; ``artifacts`` adds
    files to the run. associative_recall.py is the smallest whole task to copy.
    """

    forms: ClassVar[tuple[str, ...]] = ("causal", "encoder")
    needs_filler: ClassVar[bool] = False  # passkey hides its key in corpus text
    scores_sequences: ClassVar[bool] = True  # exact match per sequence: val/acc, val/acc_at_<L>
    partial_credit: ClassVar[bool] = False  # also the share of expected strings right: val/match_at_<L>
    form_note: ClassVar[str] = ""  # why a form is missing (appended to the refusal)
    max_length_reason: ClassVar[str] = ""  # why lengths stop at max_length (in the refusal)

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        train_lengths=(1, 20),
        eval_lengths=(5, 10, 20, 40, 80),
        eval_examples: int = 128,
    ):
        self.tok = tokenizer if tokenizer is not None else ByteTokenizer()
        if not getattr(self.tok, "byte_level", False):
            raise ConfigError(f"task={self.config_name()} writes its symbols as bytes; use tokenizer=byte")
        self.form = self.forms[0] if form is None else form
        if self.form not in self.forms:
            raise ConfigError(
                f"task.form={self.form!r} is not a form of task={self.config_name()}; use "
                f"{' or '.join(f'task.form={f}' for f in self.forms)}{self.form_note}"
            )
        self.train_lengths = self._check_train(train_lengths)
        self.eval_lengths = self._check_eval(eval_lengths)
        if isinstance(eval_examples, bool) or not isinstance(eval_examples, int) or eval_examples <= 0:
            raise ConfigError(f"task.eval_examples={eval_examples!r} must be a positive integer, e.g. 128")
        self.eval_examples = eval_examples

    @classmethod
    def config_name(cls) -> str:
        """conf/task/<name>.yaml pairs with harness/data/tasks/<name>.py."""
        return cls.__module__.rsplit(".", 1)[-1]

    @property
    def causal(self) -> bool:
        """The attention mask the model needs."""
        return self.form == "causal"

    def min_length(self) -> int:
        """The shortest length the task can build."""
        return 1

    def max_length(self) -> int | None:
        """The longest length the task can build (None: unbounded)."""
        return None

    def _check_train(self, value) -> tuple[int, int]:
        lengths = _int_list("task.train_lengths", value)
        if len(lengths) != 2 or lengths[0] > lengths[1]:
            raise ConfigError(
                f"task.train_lengths={lengths} must be [shortest, longest] (a uniform range), "
                "e.g. task.train_lengths=[1,20]"
            )
        self.check_lengths("task.train_lengths", lengths)
        return lengths[0], lengths[1]

    def _check_eval(self, value) -> tuple[int, ...]:
        lengths = _int_list("task.eval_lengths", value)
        if not lengths or lengths != sorted(set(lengths)):
            raise ConfigError(f"task.eval_lengths={lengths} must be a non-empty increasing list, e.g. [10,20,40,80]")
        self.check_lengths("task.eval_lengths", lengths)
        need = 4 * self.train_lengths[1]  # length generalization is judged at ≥ 4× the longest training length
        if lengths[-1] < need:
            raise ConfigError(
                f"task.eval_lengths={lengths} must reach 4 × the longest training length "
                f"({need}); add {need} or lower task.train_lengths"
            )
        return tuple(lengths)

    def check_lengths(self, key: str, lengths: list[int]) -> None:
        """Lengths (sorted) within [min_length, max_length]."""
        low = [n for n in lengths if n < self.min_length()]
        if low:
            raise ConfigError(
                f"{key}={lengths}: {low} below task={self.config_name()}'s shortest length "
                f"{self.min_length()}; raise them"
            )
        top = self.max_length()
        if top is not None and lengths[-1] > top:
            raise ConfigError(
                f"{key}={lengths}: {lengths[-1]} exceeds task={self.config_name()}'s longest length "
                f"{top} ({self.max_length_reason}); lower it"
            )

    def check_filler(self, filler: Tensor | None, longest: int) -> None:
        """Tasks that need filler text refuse a dataset built without it."""
        self.given_filler(filler)

    def given_filler(self, filler: Tensor | None) -> Tensor:
        """``filler``, refused when a dataset was built without it."""
        if filler is None:
            raise ConfigError(
                f"task={self.config_name()} hides its answer in filler text: build its datasets with "
                "filler=corpus.train (training) or filler=corpus.val (evaluation)"
            )
        return filler

    # --- sizes and examples -----------------------------------------------------------------

    def layout_size(self, length: int) -> int:
        """N: tokens in the full string of a ``length`` example."""
        raise NotImplementedError

    def tokens_for(self, length: int) -> int:
        """T: the model's sequence length for a ``length`` example (causal drops the last token)."""
        return self.layout_size(length) - (1 if self.causal else 0)

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        raise NotImplementedError

    def example(
        self, length: int, gen: torch.Generator, filler: Tensor | None = None, index: int | None = None
    ) -> dict:
        """input_ids, labels, key_padding_mask (all (T,)), plus ints: ``length`` and the task's extras.
        ``filler``: (M,) uint8 corpus bytes, for tasks that need them. ``index``: an evaluation example's index
        (None in training), by which a task may stratify its evaluation set (passkey spreads its depths)."""
        return self.finish(self.layout(length, gen, filler), length)

    def finish(self, lay: Layout, length: int) -> dict:
        """A layout in this task's form (the module docstring): causal, teacher forcing, position t sees tokens ≤ t
        and is scored on token t + 1 if that is an answer; encoder, Ruoss et al. 2023's empty output slots, answers
        become [MASK] inputs, scored in place."""
        if self.causal:
            if lay.answer[0]:
                raise ValueError("a causal layout cannot start with an answer: nothing predicts position 0")
            inputs, labels = lay.tokens[:-1], torch.where(lay.answer[1:], lay.tokens[1:], IGNORE)
        else:
            inputs = torch.where(lay.answer, self.tok.mask_id, lay.tokens)
            labels = torch.where(lay.answer, lay.tokens, IGNORE)
        return {
            "input_ids": inputs,
            "labels": labels,
            "key_padding_mask": torch.ones(len(labels), dtype=torch.bool),  # (T,) every position real
            "length": length,
            **lay.extras,
        }

    # --- Task, the protocol of the pipeline (harness/data/objectives.py) -----------------------

    def sequence_tokens(self, seq_len: int) -> int:
        """The longest training sequence, the model's max length (``data.seq_len`` is for text tasks)."""
        return self.tokens_for(self.train_lengths[1])

    def evaluation_tokens(self, eval_lengths: list[int]) -> list[int]:
        """The sequence lengths the final evaluation scores: ``task.eval_lengths`` in tokens."""
        return [self.tokens_for(n) for n in self.eval_lengths]

    def check_corpus(self, train_bytes: int, val_bytes: int, seq_len: int) -> None:
        """Only filler tasks read the corpus: each split must hold the longest filler they cut."""
        if self.needs_filler:
            longest = max(self.train_lengths[1], self.eval_lengths[-1])
            if min(train_bytes, val_bytes) < longest:
                raise ConfigError(
                    f"task={self.config_name()} cuts filler of up to {longest} bytes from each split, "
                    f"but the corpus splits hold {train_bytes} and {val_bytes}; use a larger corpus"
                )

    def training_data(self, corpus, seq_len: int, n: int, seed: int) -> TaskExamples:
        return self.train_dataset(seed, n, filler=corpus.train if self.needs_filler else None)

    def validation_data(self, corpus, seq_len: int) -> TaskExamples:
        """The in-distribution evaluation set (lengths drawn from ``train_lengths``): ``val/acc``."""
        return self.eval_dataset(None, filler=corpus.val if self.needs_filler else None)

    def length_data(self, corpus, length: int) -> TaskExamples:
        """The evaluation set at one length: ``val/acc_at_<length>``."""
        return self.eval_dataset(length, filler=corpus.val if self.needs_filler else None)

    # --- datasets ----------------------------------------------------------------------------

    def train_dataset(self, seed: int, n: int, filler: bytes | None = None) -> TaskExamples:
        """``n`` training examples, each with its length drawn uniformly from ``train_lengths``."""
        return TaskExamples(self, n, seed, TRAIN, None, filler)

    def eval_dataset(
        self, length: int | None, n: int | None = None, seed: int = EVAL_SEED, filler: bytes | None = None
    ) -> TaskExamples:
        """``n`` (default ``eval_examples``) evaluation examples at ``length``; ``length=None`` draws
        lengths from ``train_lengths`` (the in-distribution set behind ``val/acc``)."""
        return TaskExamples(self, self.eval_examples if n is None else n, seed, EVAL, length, filler)

    def collate(self, examples: list[dict]) -> dict[str, Tensor]:
        """Right-pads variable-length examples (positions start at 0 on the left): input_ids with the tokenizer's
        pad id, labels with -100, key_padding_mask False; integer fields become (B,) tensors."""
        fill = dict(zip(FORM_FIELDS, (self.tok.pad_id, IGNORE, False), strict=True))
        return {
            key: pad_sequence([e[key] for e in examples], batch_first=True, padding_value=fill[key])  # (B, T)
            if key in fill
            else torch.tensor([int(e[key]) for e in examples], dtype=torch.long)  # (B,)
            for key in examples[0]
        }

    def artifacts(self, results: TaskResults) -> dict[str, bytes]:
        """No files of its own unless a task overrides this (passkey.py: accuracy by depth)."""
        return {}


class TaskExamples(Dataset):
    """Example i is a pure function of (seed, split, length, i); lengths drawn per example."""

    def __init__(self, task: SyntheticTask, n: int, seed: int, stream: int, length: int | None, filler: bytes | None):
        if length is not None:
            task.check_lengths("length", [length])
        self.task, self.n, self.seed, self.stream, self.length = task, n, seed, stream, length
        self.filler = None if filler is None else torch.from_numpy(np.frombuffer(filler, dtype=np.uint8).copy())
        if task.needs_filler:
            task.check_filler(self.filler, length if length is not None else task.train_lengths[1])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.n:
            raise IndexError(index)
        gen = _example_generator(self.seed, self.stream, self.length or 0, index)
        lo, hi = self.task.train_lengths  # a length drawn uniformly from them when the dataset has none
        length = self.length if self.length is not None else lo + int(torch.randint(hi - lo + 1, (1,), generator=gen))
        return self.task.example(length, gen, self.filler, None if self.stream == TRAIN else index)
