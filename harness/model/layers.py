"""Per-layer patterns: a positional scheme or an attention variant chosen layer by layer.

``pos.layers=[rope,rope,rope,none]`` gives layers 0-2 RoPE and layer 3 no position, repeated to model.n_layers
(Llama 4's iRoPE; SmolLM3's ``no_rope_layers``); ``attn.layers=[local,local,local,local,local,softmax]`` five
sliding-window layers to one global (Gemma 2/3's local:global ratio). Both together,
``attn.layers=[local,local,local,softmax]`` with ``pos.layers=[rope,rope,rope,none]``, is RNoPE-SWA (Yang et al.
2025, "Rope to Nope and Back Again", arXiv:2501.18795; Cohere Command A): RoPE on the sliding-window layers only.
A pattern is named by its repeating unit, run-length coded: ``rope×3+none``, ``local×5+softmax``; that name is
the cell's pos (attn) in tags, reports and the matrix.

The model asks a scheme for one rotation and one bias per layer (``PositionalScheme.rotaries``,
``logit_biases``); ``LayeredScheme`` answers with each layer's own scheme. Every distinct scheme of a pattern is
built once and shared by the layers that name it (T5's table stays one table, as with a single scheme). The
(scheme, variant) pair of every layer is checked with the variants' own ``refusal`` before anything is built
beyond the modules (``check_layers``): a refusal names the layer.

Notation: T sequence length, L layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from torch import Tensor, nn

from attention.base import AttentionVariant, check_pairing
from harness.errors import ConfigError, IncompatiblePairing
from positional.base import LogitBias, PositionalScheme, Rotary, Shape


@dataclass(frozen=True)
class LayerPattern:
    """What ``pos.layers`` / ``attn.layers`` describe: the repeating unit of option names and a constructor
    (``Shape -> module``) for each distinct name. The model builds from it as it builds from one constructor."""

    key: str  # pos.layers or attn.layers, for messages
    unit: tuple[str, ...]
    factories: Mapping[str, Callable[[Shape], Any]]  # a scheme's or a variant's, by entry name

    def variants(self, shape: Shape) -> list[AttentionVariant]:
        """One attention variant per layer (each layer owns its module, as with a single variant)."""
        return [self.factories[name](shape) for name in layer_names(self.unit, shape.n_layers, self.key)]


class LayeredScheme(PositionalScheme):
    """The positional scheme of a ``pos.layers`` pattern: layer l uses the scheme its name picks.

    Its layers' schemes act inside attention (a rotation, a logit bias); one that adds to the token
    embeddings acts below every layer at once, so it is refused here. Positions are 0 … T−1 for every layer
    (randomized positions are drawn once per forward for a whole model: refused in a pattern).
    """

    def __init__(self, shape: Shape, pattern: LayerPattern):
        super().__init__(shape)
        self.label = pattern_label(pattern.unit)
        self.layer_names = layer_names(pattern.unit, shape.n_layers, pattern.key)  # the unit tiled to the layers
        self.names = list(dict.fromkeys(pattern.unit))  # the distinct entries, each built once
        built: list[PositionalScheme] = [pattern.factories[name](shape) for name in self.names]
        self.schemes = nn.ModuleList(built)  # registered as submodules (state_dict keys schemes.<i>.…)
        self._built = built  # the same modules, typed
        for name, scheme in self.named():
            check_layerable(name, scheme, pattern.key)
            if scheme.randomize:
                raise ConfigError(
                    f"{pattern.key}: pos={name} has randomize=true, but the layers of a pattern share "
                    "the positions 0 … T−1; drop randomize or the pattern"
                )
        # the positions a rotary scheme hands out itself: RoPE reuses its cos, sin when it sees its own tensor
        self._positions_from = next((s for s in built if "rotary" in s.hooks()), built[0])
        self.length_scalings = tuple(dict.fromkeys(m for s in built for m in s.length_scalings))

    def named(self) -> list[tuple[str, PositionalScheme]]:
        return list(zip(self.names, self._built, strict=True))

    def scheme(self, name: str) -> PositionalScheme:
        return self._built[self.names.index(name)]

    def layer_scheme(self, layer: int) -> PositionalScheme:
        return self.scheme(self.layer_names[layer])

    def hooks(self) -> frozenset[str]:  # type: ignore[override]  # its layers' schemes': known per instance only
        return frozenset().union(*(s.hooks() for s in self._built))

    def positions(self, t: int, device=None) -> Tensor:
        return self._positions_from.positions(t, device)

    def rotaries(self, positions: Tensor, n_layers: int) -> list[Rotary | None]:
        return self._per_layer({name: s.rotaries(positions, n_layers) for name, s in self.named()})

    def logit_biases(self, positions: Tensor, n_layers: int) -> list[LogitBias | None]:
        return self._per_layer({name: s.logit_biases(positions, n_layers) for name, s in self.named()})

    def _per_layer(self, by_scheme: dict[str, list]) -> list:
        """Layer l's entry of its own scheme's per-layer list (a per-layer table is indexed by the model's layer)."""
        return [by_scheme[name][layer] for layer, name in enumerate(self.layer_names)]

    @contextmanager
    def rescaled(self, method: str, length: int, in_training: bool = False):
        """Each scheme that has length scaling ``method`` applies it; the others are unchanged."""
        if method not in self.length_scalings:
            raise ConfigError(
                f"eval.scalings needs a positional scheme with length scalings; no scheme of "
                f"pos={self.label} has {method!r}: drop eval.scalings or use pos=rope"
            )
        with ExitStack() as stack:
            for s in self._built:
                if method in s.length_scalings:
                    stack.enter_context(s.rescaled(method, length, in_training))
            yield

    def diagnostics(self) -> dict[str, float]:
        return {f"{name}/{k}": v for name, s in self.named() for k, v in s.diagnostics().items()}

    def artifacts(self) -> dict[str, str]:
        return {f"{name}_{k}": v for name, s in self.named() for k, v in s.artifacts().items()}


def check_layerable(name: str, scheme: type[PositionalScheme] | PositionalScheme, key: str = "pos.layers") -> None:
    """A layer's scheme acts in attention: one that adds to the token embeddings acts below every layer at once."""
    if "embed" in scheme.hooks():
        raise ConfigError(
            f"{key}: pos={name} adds to the token embeddings, below every layer, so it cannot be one "
            f"layer's scheme; use it alone (pos={name}) or pattern schemes that act in attention "
            "(a rotation or a logit bias)"
        )


def check_layers(pos: PositionalScheme, variants: Sequence[AttentionVariant]) -> None:
    """Every layer's (scheme, variant) pair through the variants' ``refusal``. Without a pattern on either
    side this is the one pairing check of a model; with one, a refusal names its layer."""
    if not isinstance(pos, LayeredScheme) and len({type(v) for v in variants}) == 1:
        check_pairing(pos, type(variants[0]))
        return
    for layer, variant in enumerate(variants):
        scheme = pos.layer_scheme(layer) if isinstance(pos, LayeredScheme) else pos
        reason = type(variant).refusal(scheme)
        if reason:
            name = pos.layer_names[layer] if isinstance(pos, LayeredScheme) else scheme.config_name()
            raise IncompatiblePairing(
                f"incompatible pairing at layer {layer} (pos={name}, attn={variant.config_name()}): {reason}"
            )


# ---------------------------------------------------------------- names: a unit, its layers, its label


def layer_names(unit: Sequence[str], n_layers: int, key: str = "pos.layers") -> list[str]:
    """The repeating ``unit`` tiled to ``n_layers`` names: one per layer. Its length must divide n_layers."""
    if not unit:
        raise ConfigError(
            f"{key}=[] names no layer; give one name per layer of a repeating unit, e.g. {key}=[rope,rope,rope,none]"
        )
    if n_layers % len(unit):
        raise ConfigError(
            f"{key} has {len(unit)} entries, which does not divide model.n_layers={n_layers}; give a "
            f"unit whose length divides it (it repeats over the layers) or one name per layer"
        )
    return list(unit) * (n_layers // len(unit))


def pattern_label(unit: Sequence[str]) -> str:
    """The name of a pattern: its unit with runs written name×count, joined by +, e.g. ``rope×3+none``."""
    runs = [(name, len(list(run))) for name, run in groupby(unit)]
    return "+".join(name if count == 1 else f"{name}×{count}" for name, count in runs)


def unit_of_label(label: str) -> tuple[str, ...]:
    """The unit a pattern's name spells (``pattern_label``'s inverse; ``*`` may stand for ``×``): ``rope×3+none``
    -> (rope, rope, rope, none). A plain option name is a unit of one."""
    unit: list[str] = []
    # split at the + between its runs, not at one inside an entry's settings
    parts = re.sub(r"\([^)]*\)", lambda m: m.group(0).replace("+", "\0"), label).split("+")
    for part in (p.replace("\0", "+") for p in parts):
        name, times, count = part.replace("*", "×").partition("×")
        if not name or (times and not (count.isdigit() and int(count) > 0)):
            raise ConfigError(
                f"{label!r} is no pattern name: write option names joined by +, a run as name×count "
                "(or name*count), e.g. rope×3+none"
            )
        unit += [name] * (int(count) if count else 1)
    return tuple(unit)
