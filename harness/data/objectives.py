"""What the pipeline calls on a corpus source, a tokenizer and a task (``Source``, ``Tokenizer``, ``Task``: the
interfaces a user's own ``data=``, ``tokenizer=`` or ``task=`` class implements), and the training objectives on
text (conf/task mlm, clm).

A source may also offer, and the checks ask for it by name: ``document_starts()`` (packed documents:
``model.restart_positions``, ``model.document_mask``) and ``check_tokenizer(tokenizer, name)`` (pre-tokenized
shards, which hold one tokenizer's ids).

A task is what a conf/task/<name>.yaml builds: one of the two text objectives here, or a synthetic task
of harness/data/tasks/ (which adds evaluation by exact match: ``ScoredTask`` in harness/data/tasks/base.py).
Labels use -100 (PyTorch's ignore_index) wherever no prediction is scored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from harness.data.corpus import Corpus, check_train_split, check_val_split
from harness.data.tokenizer import document_firsts, split_ids
from harness.data.windows import IGNORE, EvalWindows, TrainWindows
from harness.errors import ConfigError


class Source(Protocol):
    """A corpus: its split sizes known before it is read (bytes, or a shard folder's token ids), then the text."""

    def sizes(self) -> tuple[int, int]:
        """(training, validation) size, without reading the corpus."""

    def load(self) -> Corpus:  # a TokenCorpus for pre-tokenized shards
        ...


class Tokenizer(Protocol):
    """Bytes to ids; a subword vocabulary is fitted on the training split (``fit``) before the first ``encode``."""

    vocab_size: int
    pad_id: int
    mask_id: int | None
    byte_level: bool  # one id per byte: token counts are byte counts before anything is read

    @classmethod
    def config_name(cls) -> str: ...

    def fit(self, corpus: Corpus) -> None: ...

    def encode(self, data: bytes) -> np.ndarray: ...

    def decode(self, ids: object) -> str: ...

    def digest(self) -> str: ...

    def regular_ids(self) -> Tensor:  # masked LM only (as word_continues): what its random replacement draws
        ...

    def word_continues(self, ids: Tensor) -> Tensor:  # (T,) bool: token t continues t − 1's word (whole-word masking)
        ...


@runtime_checkable
class Task(Protocol):
    """What the checks (harness/config/check.py), the build (harness/config/build.py) and the loaders
    (harness/data/loaders.py) call on a task; Hydra builds it with the run's tokenizer as ``tokenizer=``."""

    causal: bool  # the attention mask the model needs
    scores_sequences: bool  # True: a ScoredTask (exact match per sequence: val/acc, val/acc_at_<L>)
    collate: Callable[[list[dict]], dict[str, Tensor]] | None  # None: torch's default collate

    @classmethod
    def config_name(cls) -> str:
        """The option that builds it: conf/task/<name>.yaml."""

    def sequence_tokens(self, seq_len: int) -> int:
        """The longest training sequence: the model's max length."""

    def evaluation_tokens(self, eval_lengths: list[int]) -> list[int]:
        """The sequence lengths the final evaluation scores (memory check)."""

    def check_corpus(self, train_bytes: int, val_bytes: int, seq_len: int) -> None:
        """Refuses (ConfigError) a corpus too small for the datasets it cuts."""

    def training_data(self, corpus, seq_len: int, n: int, seed: int) -> Dataset:
        """``n`` training examples, example i a pure function of (seed, i)."""

    def validation_data(self, corpus, seq_len: int) -> Dataset:
        """The validation set, the same at every validation."""


class TextObjective:
    """Windows of a corpus (harness/data/windows.py), scored per token."""

    causal: bool = False  # masked LM's bidirectional windows, unless an objective says otherwise
    extra_tokens: int = 0  # tokens a window holds beyond the model's inputs (masked LM: none)
    scores_sequences = False
    collate = None  # torch's default collate: windows have one length

    name: str  # two objectives share this module, so each declares its option name
    tok: Tokenizer

    @classmethod
    def config_name(cls) -> str:
        """conf/task/<name>.yaml: ``mlm`` or ``clm``."""
        return cls.name

    def sequence_tokens(self, seq_len: int) -> int:
        return seq_len

    def evaluation_tokens(self, eval_lengths: list[int]) -> list[int]:
        """The sequence lengths the final evaluation scores (``eval.lengths``)."""
        return list(eval_lengths)

    def check_corpus(self, train_bytes: int, val_bytes: int, seq_len: int) -> None:
        """The splits hold the windows (byte counts are token counts for the byte tokenizer)."""
        check_train_split(train_bytes, seq_len + self.extra_tokens)
        check_val_split(val_bytes, self.extra_tokens)

    def training_data(self, corpus, seq_len: int, n: int, seed: int, world_size: int = 1) -> Dataset:
        """Random windows of the text; of pre-tokenized shards (harness/data/shards.py), random or
        sequential windows in each rank's own slice (``world_size``: the loaders pass it for those)."""
        return TrainWindows(
            split_ids(corpus, self.tok, "train"),
            seq_len + self.extra_tokens,
            n,
            seed,
            self,
            document_firsts(corpus, "train"),
            windows=getattr(corpus, "windows", "random"),  # data.windows of pre-tokenized shards
            world_size=world_size,
            stride=seq_len,  # sequential CLM windows share the shifted token
        )

    def validation_data(self, corpus, seq_len: int) -> Dataset:
        return EvalWindows(
            split_ids(corpus, self.tok, "val"),
            seq_len + self.extra_tokens,
            self,
            self.tok.pad_id,
            firsts=document_firsts(corpus, "val"),
        )


class MaskedLM(TextObjective):
    """BERT masked-LM (Devlin et al. 2019, §3.1 "Task #1" and Appendix A.1).

    Each real token is selected with probability ``mask_prob``; a selected token becomes
    [MASK] with probability ``p_mask`` (0.8), a uniformly random regular token with
    ``p_random`` (0.1) and stays unchanged otherwise (0.1). Loss only on selected tokens.
    The [MASK] id and the regular ids (every id but the specials) are the vocabulary's own.

    ``whole_word``: whole-word masking (BERT's 2019-05-31 release, google-research/bert README): each
    word is selected with probability ``mask_prob`` and all its tokens with it, so the expected share of
    selected tokens stays ``mask_prob``; the 80/10/10 choice stays per token. Word boundaries are the
    tokenizer's (``word_continues``: WordPiece's ``##``, else a token starting with a letter or digit
    right after one ending with one).
    """

    name = "mlm"

    def __init__(
        self, tokenizer, mask_prob: float = 0.15, p_mask: float = 0.8, p_random: float = 0.1, whole_word: bool = False
    ):
        if not 0.0 < mask_prob < 1.0:
            raise ConfigError(f"task.mask_prob={mask_prob} must lie in (0, 1); BERT uses 0.15")
        if p_mask < 0 or p_random < 0 or p_mask + p_random > 1:
            raise ConfigError(f"task.p_mask={p_mask} + task.p_random={p_random} must be ≥ 0 and sum to ≤ 1")
        mask_id = getattr(tokenizer, "mask_id", None)
        if mask_id is None:
            raise ConfigError(
                "task=mlm replaces tokens by [MASK], which this tokenizer's vocabulary has none of "
                "(e.g. gpt2); use task=clm, or a tokenizer with a mask token (bert-base-uncased, "
                "tokenizer=wordpiece, tokenizer=bpe)"
            )
        self.tok, self.mask_id = tokenizer, mask_id
        self.mask_prob, self.p_mask, self.p_random, self.whole_word = mask_prob, p_mask, p_random, whole_word

    def make_example(self, window: Tensor, valid: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        """window: (T,) long ids; valid: (T,) bool (False at padding). Draws, in order: 2·T uniforms (selection,
        action), the fallback token when none was selected, T random regular ids."""
        # The logic runs in numpy (views of the tensors): on a few hundred tokens torch's per-op overhead made
        # masking the data loader's bottleneck (harness/bench/loader.py).
        u_select, u_action = torch.rand(2, window.shape[0], generator=gen).numpy()
        ids, real = window.numpy(), valid.numpy()
        # (T,) the word each token is in, word k's tokens sharing draw k; without whole_word every token is a word
        word = np.cumsum(~self.tok.word_continues(window).numpy()) - 1 if self.whole_word else np.arange(len(ids))
        selected = (u_select[word] < self.mask_prob) & real
        if not selected.any():  # score at least one token (word) per sequence
            pick = int(torch.randint(int(real.sum()), (1,), generator=gen))
            selected = (word == word[pick]) & real
        random_ids = self._random_ids(window.shape, gen).numpy()
        inputs = np.where(selected & (u_action < self.p_mask), self.mask_id, ids)
        to_random = selected & (u_action >= self.p_mask) & (u_action < self.p_mask + self.p_random)
        inputs = np.where(to_random, random_ids, inputs)
        labels = np.where(selected, ids, IGNORE)
        return {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels), "key_padding_mask": valid}

    def _random_ids(self, shape, gen: torch.Generator) -> Tensor:
        """Uniform draws from the regular ids: the k-th regular id for k uniform; when they are one run of ids
        (the byte tokenizer's 0–255, a trained vocabulary's 5–V−1) the same draw without the lookup."""
        if not hasattr(self, "_regular"):
            regular = self.tok.regular_ids()
            contiguous = len(regular) and int(regular[-1]) - int(regular[0]) == len(regular) - 1
            self._regular = (int(regular[0]), int(regular[-1]) + 1) if contiguous else regular  # [low, high) or ids
        if isinstance(self._regular, tuple):
            return torch.randint(*self._regular, shape, generator=gen)
        return self._regular[torch.randint(len(self._regular), shape, generator=gen)]


class CausalLM(TextObjective):
    """Next-token prediction with a causal mask; every real next token is scored."""

    name = "clm"
    causal = True
    extra_tokens = 1  # a window of T + 1 tokens gives T inputs and T shifted labels

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def make_example(self, window: Tensor, valid: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        return {
            "input_ids": window[:-1],
            "labels": torch.where(valid[1:], window[1:], torch.full_like(window[1:], IGNORE)),
            "key_padding_mask": valid[:-1],
        }
