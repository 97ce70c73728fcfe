"""The transformer: embeddings → blocks (attention, feed-forward) → tied LM head.

The positional scheme and the attention variant are handed in as factories
(``Shape -> module``), or as per-layer patterns of them (``LayerPattern``, harness/model/layers.py);
the model calls the scheme's three hooks and passes what they return to each layer's variant. It never
asks which scheme or variant it holds.

Notation: B batch, T sequence length, C model width, H heads, D = C / H head dim, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import AttentionContext, AttentionVariant
from harness.errors import ConfigError
from harness.model.layers import LayeredScheme, LayerPattern, check_layers
from positional.base import PositionalScheme, Shape


@dataclass
class ModelConfig:
    """conf/model. Validated here, before anything is built."""

    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    norm: Literal["pre", "post"] = "pre"  # pre-LN (GPT-2, default) or post-LN (BERT, RoFormer)
    compile: bool = False  # torch.compile the forward (applied by harness.train)

    def __post_init__(self):
        for key in ("n_layers", "d_model", "n_heads", "d_ff"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model.{key}={getattr(self, key)} must be a positive integer")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                "change one so that d_model / n_heads is a whole head dim"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must lie in [0, 1)")
        if self.norm not in ("pre", "post"):
            raise ConfigError(f"model.norm={self.norm!r}: use 'pre' or 'post'")
        if not isinstance(self.compile, bool):
            raise ConfigError(f"model.compile={self.compile!r}: use true or false")


class Attention(nn.Module):
    """Projections and head splitting; the variant does the rest."""

    def __init__(self, cfg: ModelConfig, variant: AttentionVariant):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.variant = variant

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 × (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if ctx.bias is not None:  # a bias may read the input q, k, v come from (FoX's forget gates)
            ctx = replace(ctx, bias=ctx.bias.for_input(x))
        y = self.variant(q, k, v, ctx)  # (B, H, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Sequential):
    def __init__(self, cfg: ModelConfig):
        super().__init__(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, variant: AttentionVariant):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn, self.ff = Attention(cfg, variant), FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        if self.pre:  # x + f(LN(x))
            x = x + self.drop(self.attn(self.norm1(x), ctx))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, ctx)))  # LN(x + f(x)), BERT / RoFormer
        return self.norm2(x + self.drop(self.ff(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, max_len: int, causal: bool,
                 pos: Callable[[Shape], PositionalScheme] | LayerPattern,
                 attn: Callable[[Shape], AttentionVariant] | LayerPattern):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        shape = Shape(cfg.d_model, cfg.n_heads, cfg.n_layers, max_len, causal)
        self.pos = LayeredScheme(shape, pos) if isinstance(pos, LayerPattern) else pos(shape)
        variants = (attn.variants(shape) if isinstance(attn, LayerPattern) else
                    [attn(shape) for _ in range(cfg.n_layers)])
        check_layers(self.pos, variants)  # the built scheme: its options may change its declaration
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, v) for v in variants)
        self.variants = variants  # each block's, typed (the blocks hold and register them)
        self.norm_f = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        # MLM head as in BERT: transform (dense, GELU, LN), then decode with the tied embedding
        self.head = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.GELU(), nn.LayerNorm(cfg.d_model))
        self.head_bias = nn.Parameter(torch.zeros(vocab_size))
        for part in (self.tok_emb, self.blocks, self.head):  # the scheme keeps its own init
            part.apply(_init_weights)

    def forward(self, input_ids: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """input_ids: (B, T) -> logits (B, T, V). key_padding_mask: (B, T) bool, True at real tokens, or None
        when nothing is padded. Nothing here reads a tensor's value (that would wait for the GPU): a batch of
        full windows reaches the model with None, its all-true mask dropped on the host before the batch
        moves (harness/data/loaders.py ``on_device``), so attention builds and applies no mask (an all-true one
        still costs a bias scheme's step a mask pass)."""
        T = input_ids.shape[1]
        positions = self.pos.positions(T, input_ids.device)  # (T,): 0 … T−1, or a training-time sample
        x = self.drop(self.pos.embed(self.tok_emb(input_ids), positions))  # (B, T, C)
        base = AttentionContext(causal=self.causal, key_padding_mask=key_padding_mask)
        n = len(self.blocks)
        rotaries, biases = self.pos.rotaries(positions, n), self.pos.logit_biases(positions, n)  # one per layer
        for block, rotary, bias in zip(self.blocks, rotaries, biases, strict=True):
            x = block(x, replace(base, rotary=rotary, bias=bias))
        h = self.head(self.norm_f(x))  # (B, T, C)
        return F.linear(h, self.tok_emb.weight, self.head_bias)  # (B, T, V), tied decoder

    def before_training_step(self, step: int) -> None:
        """The training loop's per-step call (``AttentionVariant.before_training_step``), on the host."""
        for variant in self.variants:
            variant.before_training_step(step)

    def diagnostics(self) -> dict[str, float]:
        """What the scheme and the first layer's variant report about themselves."""
        pos = {f"pos/{k}": v for k, v in self.pos.diagnostics().items()}
        attn = {f"attn/{k}": v for k, v in self.variants[0].diagnostics().items()}
        return {**pos, **attn}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _init_weights(m: nn.Module) -> None:
    """BERT/GPT-2 initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
