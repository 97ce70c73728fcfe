"""What is measured: a cell (posbench's config groups at one shape) and the peers built at the same shape.

Peers are optional (``pip install -e .[bench]``); the harness itself never imports them. Each peer names
the posbench cell it is compared with and, where it does different work at the same shape, says so
(its FLOPs per step are reported beside posbench's too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from harness.bench.internals import build_transformer, compose_cell, option_overrides
from harness.model.transformer import ModelConfig

VOCAB = 258  # the byte tokenizer: 256 bytes + [PAD] + [MASK]


@dataclass(frozen=True)
class Spec:
    """One cell's model: posbench's config groups plus the shape peers are built with."""

    pos: str
    attn: str
    seq_len: int
    batch: int
    model: str = "small"
    causal: bool = False
    attn_overrides: tuple[str, ...] = ()

    @property
    def overrides(self) -> list[str]:
        return [
            *option_overrides("pos", self.pos),
            *option_overrides("attn", self.attn),
            f"model={self.model}",
            "model.dropout=0.0",
            f"data.seq_len={self.seq_len}",
            *self.attn_overrides,
        ]


class Built(NamedTuple):
    module: torch.nn.Module  # what .to(device), .train() and zero_grad act on
    forward: Callable[[torch.Tensor], torch.Tensor]  # (B, T) ids -> (B, T, V) logits


def build_posbench(spec: Spec) -> Built:
    model = build_transformer(spec.overrides, VOCAB, spec.seq_len, spec.causal)
    return Built(model, model)


@dataclass(frozen=True)
class Peer:
    name: str
    pos: str  # the posbench cell it is compared with
    attn: str
    build: Callable[[ModelConfig, Spec], Built]  # at the posbench cell's model settings and shape
    note: str = ""  # where it does different work at the same shape

    def builder(self) -> Callable[[Spec], Built]:
        return lambda spec: self.build(compose_cell(spec.overrides).model, spec)


def x_transformers(kind: str, flash: bool = False) -> Callable[[ModelConfig, Spec], Built]:
    """x-transformers with its defaults (``attn_flash=False``: its own attention, the T × T weights
    materialised), or with ``attn_flash=True`` (torch's SDPA, a bias passed to it as a mask)."""

    def build(m: ModelConfig, spec: Spec) -> Built:
        from x_transformers import Decoder, Encoder, TransformerWrapper

        head = m.d_model // m.n_heads
        options = {
            kind: True,
            **({"rotary_emb_dim": head} if kind == "rotary_pos_emb" else {}),  # full rotary
            **({"attn_flash": True} if flash else {}),
        }
        layers = (Decoder if spec.causal else Encoder)(
            dim=m.d_model, depth=m.n_layers, heads=m.n_heads, attn_dim_head=head, ff_mult=m.d_ff // m.d_model, **options
        )
        model = TransformerWrapper(
            num_tokens=VOCAB, max_seq_len=spec.seq_len, attn_layers=layers, use_abs_pos_emb=False, tie_embedding=True
        )
        return Built(model, model)

    return build


def _hf(kind: str) -> Callable[[ModelConfig, Spec], Built]:
    def build(m: ModelConfig, spec: Spec) -> Built:
        import transformers

        common: dict[str, Any] = dict(  # the keywords BertConfig and RoFormerConfig share (dropout off)
            vocab_size=VOCAB,
            hidden_size=m.d_model,
            num_hidden_layers=m.n_layers,
            num_attention_heads=m.n_heads,
            intermediate_size=m.d_ff,
            max_position_embeddings=spec.seq_len,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            is_decoder=spec.causal,
        )
        model: transformers.PreTrainedModel
        if kind == "roformer":
            model = (transformers.RoFormerForCausalLM if spec.causal else transformers.RoFormerForMaskedLM)(
                transformers.RoFormerConfig(embedding_size=m.d_model, **common)
            )
        else:
            model = (transformers.BertLMHeadModel if spec.causal else transformers.BertForMaskedLM)(
                transformers.BertConfig(**common)
            )
        return Built(model, lambda ids: model(input_ids=ids).logits)

    return build


def _performer_lm(m: ModelConfig, spec: Spec) -> Built:
    from performer_pytorch import PerformerLM

    model = PerformerLM(
        num_tokens=VOCAB,
        max_seq_len=spec.seq_len,
        dim=m.d_model,
        depth=m.n_layers,
        heads=m.n_heads,
        dim_head=m.d_model // m.n_heads,
        causal=spec.causal,
        ff_mult=m.d_ff // m.d_model,
        rotary_position_emb=True,
        tie_embed=True,
    )
    return Built(model, model)


PEERS: tuple[Peer, ...] = (
    Peer("x-transformers rotary", "rope", "softmax", x_transformers("rotary_pos_emb")),
    Peer("x-transformers T5 bias", "t5", "softmax", x_transformers("rel_pos_bias")),
    Peer("x-transformers ALiBi", "alibi", "softmax", x_transformers("alibi_pos_bias")),
    Peer("HF RoFormer", "rope", "softmax", _hf("roformer")),
    Peer(
        "HF BERT",
        "learned",
        "softmax",
        _hf("bert"),
        "BERT adds token-type embeddings and an embedding LayerNorm (a little more work than posbench)",
    ),
    Peer(
        "performer-pytorch PerformerLM",
        "rope",
        "performer",
        _performer_lm,
        "PerformerLM decodes without BERT's head transform (dense + GELU + LayerNorm): ~2 % fewer FLOPs",
    ),
)
