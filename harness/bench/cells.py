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

from harness.bench.internals import ROOT, build_transformer, compose_cell, option_overrides

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

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


class Built(NamedTuple):
    module: torch.nn.Module  # what .to(device), .train() and zero_grad act on
    forward: Callable[[torch.Tensor], torch.Tensor]  # (B, T) ids -> (B, T, V) logits


def build_posbench(spec: Spec) -> Built:
    model = build_transformer(spec.overrides, VOCAB, spec.seq_len, spec.causal)
    return Built(model, model)


@dataclass(frozen=True)
class Shape:
    """The shape a peer is built at: layers, width, heads, feed-forward width, vocabulary, length."""

    L: int
    C: int
    H: int
    F: int
    V: int
    T: int
    causal: bool


def peer_shape(spec: Spec) -> Shape:
    m = compose_cell(spec.overrides).model
    return Shape(m.n_layers, m.d_model, m.n_heads, m.d_ff, VOCAB, spec.seq_len, spec.causal)


@dataclass(frozen=True)
class Peer:
    name: str
    pos: str  # the posbench cell it is compared with
    attn: str
    build: Callable[[Shape], Built]
    note: str = ""  # where it does different work at the same shape

    def builder(self) -> Callable[[Spec], Built]:
        return lambda spec: self.build(peer_shape(spec))


def x_transformers(kind: str, flash: bool = False) -> Callable[[Shape], Built]:
    """x-transformers with its defaults (``attn_flash=False``: its own attention, the T × T weights
    materialised), or with ``attn_flash=True`` (torch's SDPA, a bias passed to it as a mask)."""

    def build(s: Shape) -> Built:
        from x_transformers import Decoder, Encoder, TransformerWrapper

        options = {
            kind: True,
            **({"rotary_emb_dim": s.C // s.H} if kind == "rotary_pos_emb" else {}),  # full rotary
            **({"attn_flash": True} if flash else {}),
        }
        layers = (Decoder if s.causal else Encoder)(
            dim=s.C, depth=s.L, heads=s.H, attn_dim_head=s.C // s.H, ff_mult=s.F // s.C, **options
        )
        model = TransformerWrapper(
            num_tokens=s.V, max_seq_len=s.T, attn_layers=layers, use_abs_pos_emb=False, tie_embedding=True
        )
        return Built(model, model)

    return build


def _hf(kind: str) -> Callable[[Shape], Built]:
    def build(s: Shape) -> Built:
        import transformers

        common: dict[str, Any] = dict(  # the keywords BertConfig and RoFormerConfig share (dropout off)
            vocab_size=s.V,
            hidden_size=s.C,
            num_hidden_layers=s.L,
            num_attention_heads=s.H,
            intermediate_size=s.F,
            max_position_embeddings=s.T,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            is_decoder=s.causal,
        )
        model: transformers.PreTrainedModel
        if kind == "roformer":
            roformer = transformers.RoFormerConfig(embedding_size=s.C, **common)
            model = (transformers.RoFormerForCausalLM if s.causal else transformers.RoFormerForMaskedLM)(roformer)
        else:
            bert = transformers.BertConfig(**common)
            model = (transformers.BertLMHeadModel if s.causal else transformers.BertForMaskedLM)(bert)
        return Built(model, lambda ids: model(input_ids=ids).logits)

    return build


def _performer_lm(s: Shape) -> Built:
    from performer_pytorch import PerformerLM

    model = PerformerLM(
        num_tokens=s.V,
        max_seq_len=s.T,
        dim=s.C,
        depth=s.L,
        heads=s.H,
        dim_head=s.C // s.H,
        causal=s.causal,
        ff_mult=s.F // s.C,
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


def available(group: str) -> list[str]:
    """The options of a config group: conf/<group>/*.yaml."""
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
