"""The transformer: embeddings → blocks (attention, feed-forward) → LM head.

Two blocks, chosen per run by conf/model (every part is its own key, so an ablation can move one at a time):
  classic  BERT / GPT-2 (model=small): LayerNorm, GELU MLP, biases, BERT's MLM head (dense, GELU, LayerNorm)
           decoding with the tied token embedding.
  modern   Llama / Qwen3 (model=modern): RMSNorm (Zhang & Sennrich 2019), SwiGLU MLP (Shazeer 2020, "GLU Variants
           Improve Transformer", Eq. 6: (Swish(xW) ⊙ xV) W₂), no biases, an untied output layer after the final
           norm, optionally QK-norm (model.qk_norm: RMSNorm over each head's q and k before the rotation, as
           Qwen3 and OLMo 2 do; Dehghani et al. 2023 introduced it with LayerNorm). RoPE in the half layout is the
           scheme's own option (pos.layout=half), set by the presets that use this block.
An option of any block: a length-scaled attention temperature (model.temperature, harness/model/temperature.py).

The positional scheme and the attention variant are handed in as factories
(``Shape -> module``), or as per-layer patterns of them (``LayerPattern``, harness/model/layers.py);
the model calls the scheme's three hooks and passes what they return to each layer's variant. It never
asks which scheme or variant it holds.

Notation: B batch, T sequence length, C model width, H heads, D = C / H head dim, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import AttentionContext, AttentionVariant
from harness.errors import ConfigError
from harness.model.layers import LayeredScheme, LayerPattern, check_layers
from harness.model.temperature import LengthTemperature
from harness.ranges import DropoutRate, Float32, PositiveInt, Range, check_fields
from positional.base import PositionalScheme, Shape, document_positions

LossChunk = Annotated[int, Range("a positive number of tokens or null", ge=1)]


@dataclass
class ModelConfig:
    """conf/model. Each field's type and range is its annotation (harness/ranges.py): loading the config checks the
    node against them, and ``__post_init__`` checks a ModelConfig built from Python the same way, in the same words;
    it adds the one rule across fields (heads divide the width)."""

    n_layers: PositiveInt = 4
    d_model: PositiveInt = 128
    n_heads: PositiveInt = 4
    d_ff: PositiveInt = 512
    dropout: DropoutRate = 0.1
    norm: Literal["pre", "post"] = "pre"  # pre-LN (GPT-2, default) or post-LN (BERT, RoFormer)
    compile: bool = False  # torch.compile the forward (applied by harness.train)
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp: Literal["gelu", "swiglu"] = "gelu"  # swiglu: three d_model × d_ff matrices (gelu: two)
    bias: bool = True  # biases of the linear layers and of LayerNorm
    qk_norm: bool = False  # RMSNorm over each head's q and k, before the rotation
    head: Literal["bert", "tied", "untied"] = "bert"  # BERT's MLM head | final norm → token embeddingᵀ | own layer
    temperature: Literal["none", "ssmax", "llama4"] = "none"  # length-scaled attention temperature
    temperature_layers: Literal["all", "nope"] = "all"  # nope: only layers whose scheme acts nowhere in attention
    temperature_init: Float32 | None = None  # ssmax: s at the start (null: 1 / log of the training length)
    temperature_floor: PositiveInt = 8192  # llama4: F in 1 + β·log(1 + ⌊(i+1)/F⌋)
    temperature_scale: Float32 = 0.1  # llama4: β
    # Packed documents (the data source passes where each starts, ``document_ids``): positions restart at each
    # document's first token; attention stays inside each document (softmax attention)
    restart_positions: bool = False
    document_mask: bool = False
    # The training loss's logits ``loss_chunk`` tokens at a time, made again in the backward (harness/model/loss.py):
    # null holds the whole batch's (B·T, V) logits four times over (16 bytes a token and vocabulary entry)
    loss_chunk: LossChunk | None = None

    def __post_init__(self):
        check_fields(self, "model")  # types, choices, finiteness, ranges: the annotations above
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                "change one so that d_model / n_heads is a whole head dim"
            )

    @property
    def mlp_matrices(self) -> int:
        """d_model × d_ff matrices in one MLP: 2 (GELU), 3 (SwiGLU's gate, up and down)."""
        return 3 if self.mlp == "swiglu" else 2

    def norm_layer(self, width: int) -> nn.Module:
        return nn.RMSNorm(width, eps=1e-6) if self.norm_type == "rmsnorm" else nn.LayerNorm(width, bias=self.bias)


class Attention(nn.Module):
    """Projections and head splitting (QK-norm, temperature where configured); the variant does the rest."""

    def __init__(self, cfg: ModelConfig, variant: AttentionVariant, temperature: LengthTemperature | None = None):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.variant = variant
        head_dim = cfg.d_model // cfg.n_heads
        self.q_norm: nn.Module = nn.RMSNorm(head_dim, eps=1e-6) if cfg.qk_norm else nn.Identity()
        self.k_norm: nn.Module = nn.RMSNorm(head_dim, eps=1e-6) if cfg.qk_norm else nn.Identity()
        self.temperature = temperature

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 × (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.temperature is not None:  # τ_i·q_i; the variant's rotation is linear, so before or after is one
            q = self.temperature(q, self.variant.keys_attended(T, ctx, x.device))
        if ctx.bias is not None:  # a bias may read the input q, k, v come from (FoX's forget gates)
            ctx = replace(ctx, bias=ctx.bias.for_input(x))
        y = self.variant(q, k, v, ctx)  # (B, H, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    """(Swish(x W) ⊙ x V) W₂, Shazeer 2020 Eq. 6 (Swish = SiLU, β = 1): W, V fused into one C → 2F layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # 2 × (B, T, F)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, variant: AttentionVariant, temperature: LengthTemperature | None = None):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.norm1, self.norm2 = cfg.norm_layer(cfg.d_model), cfg.norm_layer(cfg.d_model)
        self.attn = Attention(cfg, variant, temperature)
        self.ff = (
            SwiGLU(cfg)
            if cfg.mlp == "swiglu"
            else nn.Sequential(  # GELU's: W₂ GELU(x W₁)
                nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias),
                nn.GELU(),
                nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias),
            )
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        if self.pre:  # x + f(LN(x))
            x = x + self.drop(self.attn(self.norm1(x), ctx))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, ctx)))  # LN(x + f(x)), BERT / RoFormer
        return self.norm2(x + self.drop(self.ff(x)))


class Transformer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        max_len: int,
        causal: bool,
        pos: Callable[[Shape], PositionalScheme] | LayerPattern,
        attn: Callable[[Shape], AttentionVariant] | LayerPattern,
    ):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        shape = Shape(cfg.d_model, cfg.n_heads, cfg.n_layers, max_len, causal, cfg.restart_positions, cfg.document_mask)
        self.pos = LayeredScheme(shape, pos) if isinstance(pos, LayerPattern) else pos(shape)
        # each block's variant, typed (the blocks hold and register them)
        self.variants = (
            attn.variants(shape) if isinstance(attn, LayerPattern) else [attn(shape) for _ in range(cfg.n_layers)]
        )
        check_layers(self.pos, self.variants)  # the built scheme: its options may change its declaration
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, v, _temperature(cfg, scheme, max_len)) for scheme, v in self.layers())
        self.norm_f = cfg.norm_layer(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        # BERT's MLM head: transform (dense, GELU, LN), then decode with the tied embedding
        bert = cfg.head == "bert"
        self.head: nn.Module = (
            nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias), nn.GELU(), cfg.norm_layer(cfg.d_model))
            if bert
            else nn.Identity()
        )
        self.head_bias = nn.Parameter(torch.zeros(vocab_size)) if bert and cfg.bias else None
        # untied: its own output layer (Llama's lm_head)
        self.decoder = nn.Linear(cfg.d_model, vocab_size, bias=False) if cfg.head == "untied" else None
        for part in (self.tok_emb, self.blocks, self.head, self.decoder):  # the scheme keeps its own init
            if part is not None:
                part.apply(_init_weights)

    def forward(
        self,
        input_ids: Tensor,
        key_padding_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
        decode: bool = True,
    ) -> Tensor:
        """input_ids: (B, T) -> logits (B, T, V): the decoder (``output_layer``) over ``hidden``; ``decode=False``:
        the decoder's input (B, T, C), for a loss that applies the decoder itself (harness/model/loss.py) — through
        ``__call__``, so a compiled model (model.compile) runs compiled either way."""
        h = self.hidden(input_ids, key_padding_mask, document_ids)
        return F.linear(h, *self.output_layer()) if decode else h

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The decoder's (weight (V, C), bias (V,) or None): the token embedding's when tied (BERT's head, ``tied``)."""
        return (self.tok_emb.weight if self.decoder is None else self.decoder.weight), self.head_bias

    def hidden(
        self, input_ids: Tensor, key_padding_mask: Tensor | None = None, document_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids: (B, T) -> the decoder's input (B, T, C). key_padding_mask: (B, T) bool, True at real
        tokens, or None when nothing is padded. Nothing here reads a tensor's value (that would wait for the GPU):
        a batch of full windows reaches the model with None, its all-true mask dropped on the host before the batch
        moves (harness/data/loaders.py ``on_device``), so attention builds and applies no mask (an all-true one
        still costs a bias scheme's step a mask pass).
        document_ids: (B, T), equal within each packed document, or None (each row one document): read only under
        model.restart_positions (positions restart per document, (B, T)) and model.document_mask."""
        positions = (
            document_positions(document_ids)  # (B, T): each document's tokens at 0, 1, …
            if document_ids is not None and self.pos.shape.restart_positions
            else self.pos.positions(input_ids.shape[1], input_ids.device)  # (T,): 0 … T−1, or a sample
        )
        x = self.drop(self.pos.embed(self.tok_emb(input_ids), positions))  # (B, T, C)
        isolate = document_ids if self.pos.shape.document_mask else None  # attention kept inside each document
        base = AttentionContext(causal=self.causal, key_padding_mask=key_padding_mask, document_ids=isolate)
        n = len(self.blocks)
        rotaries, biases = self.pos.rotaries(positions, n), self.pos.logit_biases(positions, n)  # one per layer
        for block, rotary, bias in zip(self.blocks, rotaries, biases, strict=True):
            x = block(x, replace(base, rotary=rotary, bias=bias))
        return self.head(self.norm_f(x))  # (B, T, C)

    def before_training_step(self, step: int) -> None:
        """The training loop's per-step call (``AttentionVariant.before_training_step``), on the host."""
        for variant in self.variants:
            variant.before_training_step(step)

    def diagnostics(self) -> dict[str, float]:
        """What the scheme and the first layer's variant report about themselves."""
        return {
            **{f"pos/{k}": v for k, v in self.pos.diagnostics().items()},
            **{f"attn/{k}": v for k, v in self.variants[0].diagnostics().items()},
        }

    def layers(self) -> list[tuple[PositionalScheme, AttentionVariant]]:
        """Each layer's (positional scheme, attention variant): a pattern's own scheme for its layer."""
        return [
            (self.pos.layer_scheme(i) if isinstance(self.pos, LayeredScheme) else self.pos, v)
            for i, v in enumerate(self.variants)
        ]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _temperature(cfg: ModelConfig, scheme: PositionalScheme, max_len: int) -> LengthTemperature | None:
    """The length temperature of a layer whose positional scheme is ``scheme``, if model.temperature asks for one
    there (``temperature_layers=nope``: only where the scheme neither rotates nor biases, Llama 4's NoPE layers)."""
    if cfg.temperature == "none" or (cfg.temperature_layers == "nope" and scheme.hooks() & {"rotary", "logit_bias"}):
        return None
    return LengthTemperature(
        cfg.temperature, cfg.n_heads, max_len, cfg.temperature_init, cfg.temperature_floor, cfg.temperature_scale
    )


def _init_weights(m: nn.Module) -> None:
    """BERT/GPT-2 initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
