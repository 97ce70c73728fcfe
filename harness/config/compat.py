"""The pos × attn compatibility matrix, decided from declarations only.

Every pos and attn option on the config search path (conf/ and the user's ``--config-dir``) names a class
by ``_target_``; the class is imported (never instantiated) and ``AttentionVariant.refusal(scheme)``
decides the pairing. The same call is
what ``check_pairing`` makes when a model is built, so the matrix and the runs cannot disagree.

``python run.py --matrix`` prints it as text, ``python run.py --matrix=md`` as markdown. A per-layer pattern
named on its command line (``pos.layers=[rope,rope,rope,none]``, ``attn.layers=[local,softmax]``) adds its row
(column), named by the pattern (``rope×3+none``): a pairing is refused where any layer's is, naming the layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config.catalog import check_catalogue_args, option_classes, target_overrides, user_config_dirs
from harness.config.values import parse_entry, pattern_unit
from harness.errors import ConfigError
from harness.markdown import table


@dataclass(frozen=True)
class Pairing:
    pos: str
    attn: str
    refusal: str | None  # None: the pairing trains

    @property
    def allowed(self) -> bool:
        return self.refusal is None


Layers = tuple[tuple[str, type], ...]  # (entry, class) per layer of a repeating unit


def compatibility(
    extra: Sequence[str | Path] = (),
    targets: dict[str, str] | None = None,
    patterns: dict[str, tuple[str, ...]] | None = None,
) -> list[Pairing]:
    """One pairing per (pos, attn) option pair, pos-major, both in name order. ``extra``: the user's config
    directories; ``targets``: classes named on the command line (``pos._target_=mypkg.MyScheme``), added;
    ``patterns``: per-layer patterns (``{"pos": ("rope", "rope", "rope", "none")}``), added last."""
    targets, patterns = targets or {}, patterns or {}
    schemes, variants = (option_classes(group, extra, targets.get(group)) for group in ("pos", "attn"))
    rows: dict[str, Layers] = {p: ((p, scheme),) for p, scheme in schemes.items()}
    columns: dict[str, Layers] = {a: ((a, variant),) for a, variant in variants.items()}
    for group, found, into in (("pos", schemes, rows), ("attn", variants, columns)):
        if group in patterns:
            into.update(_pattern(group, patterns[group], found))
    return [
        Pairing(p, a, _refusal(layers, per_layer)) for p, layers in rows.items() for a, per_layer in columns.items()
    ]


def _pattern_overrides(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """``{group: unit}`` for each ``pos.layers=[…]`` / ``+attn.layers=[…]`` among command-line ``argv``."""
    found = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        group, _, rest = key.lstrip("+").partition(".")
        if eq and group in ("pos", "attn") and rest == "layers":
            found[group] = pattern_unit(value.strip().removeprefix("[").removesuffix("]").replace("'", ""), group)
    return found


def _pattern(group: str, unit: tuple[str, ...], found: dict[str, type]) -> dict[str, Layers]:
    from harness.model.layers import check_layerable, pattern_label

    names = [parse_entry(entry, f"{group}.layers")[0] for entry in unit]  # an entry's settings keep its class
    for name in names:
        if name not in found:
            raise ConfigError(
                f"{group}.layers names {name!r}, which is no {group} option; use names of "
                f"conf/{group}/: {', '.join(found)}"
            )
        if group == "pos":
            check_layerable(name, found[name], f"{group}.layers")
    return {pattern_label(unit): tuple((entry, found[name]) for entry, name in zip(unit, names, strict=True))}


def _refusal(schemes: Layers, variants: Layers) -> str | None:
    """The first layer whose variant refuses its scheme; a pattern repeats, so lcm(unit lengths) layers decide."""
    from attention.base import AttentionVariant
    from positional.base import PositionalScheme

    n = math.lcm(len(schemes), len(variants))
    for layer in range(n):
        (_, scheme), (_, variant) = schemes[layer % len(schemes)], variants[layer % len(variants)]
        if not (issubclass(variant, AttentionVariant) and issubclass(scheme, PositionalScheme)):
            raise ConfigError(
                f"{variant.__qualname__} or {scheme.__qualname__} is no attention variant or scheme; "
                "name classes of attention.base.AttentionVariant and positional.base.PositionalScheme"
            )
        reason = variant.refusal(scheme)
        if reason:
            return reason if n == 1 else f"layer {layer}: {reason}"
    return None


def _grid(pairings: list[Pairing]) -> tuple[list[str], list[str], dict[tuple[str, str], Pairing], list[str]]:
    """The rows, the columns, each pairing by (row, column), and the refusals' reasons, each once."""
    return (
        list(dict.fromkeys(c.pos for c in pairings)),
        list(dict.fromkeys(c.attn for c in pairings)),
        {(c.pos, c.attn): c for c in pairings},
        list(dict.fromkeys(c.refusal for c in pairings if c.refusal)),
    )


def _mark(pairing: Pairing, reasons: list[str], yes: str, no: str) -> str:
    return yes if pairing.refusal is None else f"{no} [{reasons.index(pairing.refusal) + 1}]"


def render_text(pairings: list[Pairing]) -> str:
    pos, attn, at, reasons = _grid(pairings)
    width = max(len(a) for a in attn + ["refused [99]"]) + 2
    first = max(len(p) for p in pos + ["pos \\ attn"]) + 2
    lines = ["pos \\ attn".ljust(first) + "".join(a.ljust(width) for a in attn)]
    lines += [
        p.ljust(first) + "".join(_mark(at[p, a], reasons, "ok", "refused").ljust(width) for a in attn) for p in pos
    ]
    lines += [""] + [f"[{n}] {r}" for n, r in enumerate(reasons, 1)]
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"


def render_markdown(pairings: list[Pairing]) -> str:
    pos, attn, at, reasons = _grid(pairings)
    lines = table(
        ["pos \\ attn", *(f"`{a}`" for a in attn)],
        [[f"`{p}`", *(_mark(at[p, a], reasons, "✓", "✗") for a in attn)] for p in pos],
    )
    if reasons:
        lines += ["", "Refused:", ""] + [f"{n}. {r}" for n, r in enumerate(reasons, 1)]
    return "\n".join(lines) + "\n"


def print_matrix(flag: str, argv: Sequence[str] = ()) -> int:
    """``--matrix`` (text) or ``--matrix=md``, over conf/, the ``--config-dir`` options, any
    ``pos._target_=`` / ``attn._target_=`` class and any ``pos.layers=`` / ``attn.layers=`` pattern in ``argv``;
    returns the exit status."""
    argv = list(argv)
    fmt = check_catalogue_args(flag, argv)
    pairings = compatibility(user_config_dirs(argv), target_overrides(argv), _pattern_overrides(argv))
    print(render_markdown(pairings) if fmt == "md" else render_text(pairings), end="")
    return 0
