"""The run's model is constructed once (harness/config/deferred.py): on meta for the checks, then materialised by
replaying its constructors' ops — with every parameter and buffer bit-identical to a direct construction after
the same seed, and the global generator left where a direct construction leaves it, so that every committed
result stays reproducible from its command."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from harness.config.catalog import options
from harness.config.compose import compose
from harness.config.deferred import construct
from harness.config.instantiate import instantiate, instantiate_option
from harness.errors import ConfigError
from harness.model.transformer import Transformer
from positional.base import PositionalScheme
from tests.helpers import validated

SCHEMES, VARIANTS = list(options("pos")), list(options("attn"))  # every conf/pos, conf/attn option


@functools.cache
def _node(*overrides: str):
    return compose(list(overrides))


def _factory(overrides: tuple[str, ...], pos: str, attn: str):
    cfg = _node(*overrides)
    model_cfg = instantiate(cfg.model)
    pos_node, attn_node = _node(f"pos={pos}", *overrides).pos, _node(f"attn={attn}").attn
    return lambda: Transformer(model_cfg, 96, 64, True, pos=instantiate_option(pos_node, "pos"),
                               attn=instantiate_option(attn_node, "attn"))


def _direct_and_replayed(make, seed: int = 3):
    torch.manual_seed(seed)
    direct, after_direct = make(), torch.get_rng_state()
    deferred = construct(make)
    torch.manual_seed(seed)
    replayed, after_replay = deferred.materialize(), torch.get_rng_state()
    return deferred, direct, replayed, torch.equal(after_direct, after_replay)


def _identical(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(keep_vars=True), b.state_dict(keep_vars=True)
    return sa.keys() == sb.keys() and all(
        torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype and sa[k].stride() == sb[k].stride()
        and type(sa[k]) is type(sb[k]) and sa[k].requires_grad == sb[k].requires_grad for k in sa)


@pytest.mark.parametrize("overrides", [(), ("model=modern",), ("pos.randomize=true", "pos.max_position=64")],
                         ids=["classic", "modern", "randomized"])
@pytest.mark.parametrize("attn", VARIANTS)
def test_a_replayed_construction_is_the_direct_one_bit_for_bit(attn, overrides):
    built = 0
    for pos in SCHEMES:
        make = _factory(overrides, pos, attn)
        try:
            deferred, direct, replayed, same_stream = _direct_and_replayed(make)
        except ConfigError:  # a pairing the constructors refuse (the same on meta)
            continue
        built += 1
        assert deferred.replayable, (pos, deferred.recording.unreplayable)
        assert _identical(direct, replayed), pos
        assert same_stream, pos
        assert not any(t.is_meta for t in (*replayed.parameters(), *replayed.buffers()))
        x = torch.randint(0, 96, (2, 64))
        assert torch.equal(direct.eval()(x), replayed.eval()(x)), pos
    assert built >= 4  # (a case that constructs nothing would prove nothing)


def test_the_meta_twin_is_free_to_change_and_the_replay_is_not_affected():
    make = _factory((), "rope", "performer")
    torch.manual_seed(0)
    direct = make()
    deferred = construct(make)
    with torch.device("meta"):  # a check's forward and backward, as the rehearsal runs them
        deferred.meta(torch.zeros(2, 64, dtype=torch.long)).sum().backward()
    deferred.meta.eval()
    torch.manual_seed(0)
    replayed = deferred.materialize()
    assert replayed.training and all(p.grad is None for p in replayed.parameters())
    assert _identical(direct, replayed)


class _OwnGenerator(nn.Module):
    """A user's module that draws from its own generator: its draws are not in the global stream."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, generator=torch.Generator().manual_seed(1)))
        self.v = nn.Parameter(torch.randn(3))


class _HostDraw(nn.Module):
    """Performer's first way: a seed drawn on the host at once (the generator at recording time is not the seeded
    one), read there, and a table drawn from it."""

    def __init__(self):
        super().__init__()
        self.seed = nn.Buffer(torch.randint(10, (), device="cpu"))
        self.w = nn.Parameter(torch.randn(int(self.seed) + 1))


class _LooseTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.arange(4.0)  # neither a parameter nor a buffer: materialising could not reach it
        self.host = torch.arange(3.0, device="cpu")  # made on the host: kept as it is
        self.w = nn.Parameter(torch.randn(2))


@pytest.mark.parametrize("cls, why", [(_OwnGenerator, "torch.Generator"),
                                      (_LooseTensor, "_LooseTensor.table is a meta tensor"),
                                      (_HostDraw, "drew random numbers on cpu")])
def test_what_a_record_cannot_replay_is_noticed_and_constructed_directly(cls, why):
    deferred, direct, replayed, same_stream = _direct_and_replayed(cls)
    assert not deferred.replayable and why in deferred.recording.unreplayable
    assert _identical(direct, replayed)
    assert same_stream and not any(t.is_meta for t in replayed.parameters())


@pytest.fixture
def constructions(monkeypatch):
    """How many schemes and attention variants are constructed (on any device) from here on."""
    from attention.base import AttentionVariant

    counts = {"scheme": 0, "variant": 0}

    def counting(cls, kind):
        init = cls.__init__

        def counted(self, *args, **kwargs):  # every scheme's (variant's) constructor calls its base's once
            counts[kind] += 1
            init(self, *args, **kwargs)
        return counted

    monkeypatch.setattr(PositionalScheme, "__init__", counting(PositionalScheme, "scheme"))
    monkeypatch.setattr(AttentionVariant, "__init__", counting(AttentionVariant, "variant"))
    return counts


def test_a_run_constructs_its_scheme_and_variants_once(constructions):
    from harness.config.build import build

    checked = validated("pos=t5", "attn=performer", "model.n_layers=2")
    corpus = checked.source.load()
    checked.tokenizer.fit(corpus)
    built = build(checked, corpus, 0, logger=False, callbacks=[])
    assert constructions == {"scheme": 1, "variant": 2}  # one scheme, one variant per layer
    assert not any(t.is_meta for t in built.model.state_dict().values())


def test_checking_for_a_named_gpu_constructs_the_scheme_once(constructions):
    """``--check --gpu-memory``: the variant's per-layer bytes are measured on the run's construction, cut to 1
    and 2 layers (and with softmax in their place: the only other variants constructed)."""
    from harness.config.resources import NamedGpu

    checked = validated("pos=t5", "attn=performer", "model.n_layers=3", "trainer=gpu", gpu=NamedGpu.parse("80GB"))
    assert checked.gpu is not None
    assert constructions == {"scheme": 1, "variant": 3 + 1}
