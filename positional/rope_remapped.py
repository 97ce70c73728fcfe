"""Training-free context extension by remapped positions: each query-key pair attends with RoPE at positions chosen
for that pair, so no distance the model sees lies beyond what it trained on. ``eval.scalings=[self_extend,dca]`` on
posbench's own RoPE models; hf-eval's ``self_extend`` and ``dca`` cells on a Hugging Face model
(harness/pretrained/remapped.py) take the same definitions from here.

- **Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
  arXiv:2401.01325, §3): a pair with i − j < W (the neighbour window) at i and j as trained; a farther one with the
  query at ⌊i/G⌋ + W − ⌊W/G⌋ and the key at ⌊j/G⌋ (G: the group size), distances that continue the window's.
- **Dual Chunk Attention** (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
  arXiv:2402.17463, §3; the authors' ChunkLlama code for its constants): the sequence cut into chunks of s tokens;
  every key at its position within its chunk, j mod s; the query at its own, i mod s, for keys of its chunk
  (intra-chunk), at min(i mod s + s, s + w) for keys of the chunk before (successive: its first w queries keep
  their distance to the neighbouring chunk, w the local window), and at min(2s − 1, s + w) for older chunks
  (inter-chunk). Qwen2.5-1M ships DCA.

For posbench's softmax attention the remapped logits are a content logit bias: for each kind of pair, its logits
at the remapped positions less those at the positions the rotary gave, divided by √D, where the pair is of that
kind — so softmax(q kᵀ/√D + b) is the remapped attention, and a variant that never forms the logits (local,
kernelized) refuses it as it refuses any content bias.

Notation: i, j query and key positions, T length, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from positional.base import LogitBias

Parts = list[tuple[Tensor, Tensor, Tensor]]  # (query positions, key positions, the pairs they serve) per kind


@dataclass(frozen=True)
class SelfExtend:
    group: int  # G
    window: int  # W, the neighbour window

    def parts(self, i: Tensor) -> Parts:
        """i: positions (T,) or (B, T); the pairs (T, T) or (B, T, T)."""
        near = (i[..., :, None] - i[..., None, :]) < self.window
        grouped = i // self.group + self.window - self.window // self.group
        return [(i, i, near), (grouped, i // self.group, ~near)]

    def name(self) -> str:
        return f"self_extend group {self.group} window {self.window}"

    @staticmethod
    def fitting(length: int, trained: int) -> SelfExtend:
        """W = half the trained context, G the smallest group size whose farthest distance stays inside it."""
        window = max(1, trained // 2)
        group = 1
        while (length - 1) // group + window - window // group > trained - 1:
            group += 1
        return SelfExtend(group, window)


@dataclass(frozen=True)
class DualChunk:
    chunk: int  # s
    local: int  # w, the local window of the successive chunk

    def parts(self, i: Tensor) -> Parts:
        within, chunk = i % self.chunk, i // self.chunk
        apart = chunk[..., :, None] - chunk[..., None, :]
        successive = torch.clamp(within + self.chunk, max=self.chunk + self.local)
        inter = torch.full_like(i, min(2 * self.chunk - 1, self.chunk + self.local))
        return [(within, within, apart == 0), (successive, within, apart == 1), (inter, within, apart >= 2)]

    def name(self) -> str:
        return f"dca chunk {self.chunk} local {self.local}"

    @staticmethod
    def fitting(trained: int) -> DualChunk:
        """The authors' defaults from the trained context L: local window ⌊L/16⌋, chunk ⌊3L/4⌋ − ⌊L/16⌋ (11L/16 where
        16 divides L), so chunk + local = ⌊3L/4⌋."""
        return DualChunk(max(1, trained * 3 // 4 - trained // 16), max(1, trained // 16))


Remap = SelfExtend | DualChunk
REMAPS = {"self_extend": SelfExtend, "dca": DualChunk}


class RemappedLogits(LogitBias):
    """The content bias that turns softmax attention over RoPE at ``positions`` into ``remap``'s (module doc);
    ``rotate(x, positions)`` is the scheme's rotation of (B, H, T, D) at other positions."""

    kind = "content"

    def __init__(self, remap: Remap, positions: Tensor, rotate: Callable[[Tensor, Tensor], Tensor]):
        self.remap, self.positions, self.rotate = remap, positions, rotate

    def dense(self, q: Tensor, k: Tensor) -> Tensor:
        """(B or 1, 1, T, T), q and k unrotated (B, H, T, D)."""
        i, scale = self.positions, q.shape[-1] ** -0.5
        plain = self.rotate(q, i) @ self.rotate(k, i).transpose(-2, -1)
        bias = torch.zeros_like(plain)
        for at_q, at_k, pairs in self.remap.parts(i):
            remapped = self.rotate(q, at_q) @ self.rotate(k, at_k).transpose(-2, -1)
            bias = torch.where(pairs.unsqueeze(-3) if pairs.dim() == 3 else pairs, (remapped - plain) * scale, bias)
        return bias
