"""Ranges declared where a parameter is: ``init_std: NonNegative = 0.02``, ``mlp_width: PositiveInt = 32``.

A constructor's signature is the schema of its config node (harness/config/schema.py), so a range
written into its annotation is checked by the validation pass before anything is built, for our
classes and a user's alike, with the node's full key (``pos.init_std=-1 must be a number ≥ 0``).
``@ranged`` on ``__init__`` checks the same annotations when the class is built from Python.
Checks a range cannot say (an even count, one value above another) stay in the constructor.

The ground: imports only harness.errors.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from harness.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A closed or open interval for a number; ``words`` say it in a message ("a positive integer")."""

    words: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    le: float | None = None

    def holds(self, value: float) -> bool:
        return math.isfinite(value) and ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))


Positive = Annotated[float, Range("a positive number", gt=0)]
NonNegative = Annotated[float, Range("a number ≥ 0", ge=0)]
PositiveInt = Annotated[int, Range("a positive integer", ge=1)]
UnitInterval = Annotated[float, Range("a number in [0, 1]", ge=0, le=1)]
DropoutRate = Annotated[float, Range("a number in [0, 1)", ge=0, lt=1)]
SignificanceLevel = Annotated[float, Range("a level in (0, 1)", gt=0, lt=1)]
Fraction = Annotated[float, Range("a number in (0, 1]", gt=0, le=1)]


def at_most(annotation: Any, most: int) -> Any:
    """``annotation`` bounded above: a count a flag may make large (steps, repeats, tokens, threads), bounded like
    memory, ``at_most(PositiveInt, 1000)``. Its own range is checked first (``-1 must be a positive integer``)."""
    return Annotated[annotation, Range(f"at most {most:,}", le=most)]


def violated(value: Any, annotation: Any) -> Range | None:
    """The range ``value`` breaks, if the branch of ``annotation`` it fits declares one (lists item by item)."""
    if typing.get_origin(annotation) is Annotated:
        base, *meta = typing.get_args(annotation)
        inner = violated(value, base)
        if inner:
            return inner
        if _number(value) and _fits_number(value, base):
            return next((r for r in meta if isinstance(r, Range) and not r.holds(value)), None)
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return next((r for r in (violated(value, a) for a in args) if r), None)
    if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
        per_item = args[:1] * len(value) if origin is list or args[-1] is Ellipsis else args
        return next((r for v, a in zip(value, per_item, strict=False) if (r := violated(v, a))), None)
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fits_number(value: Any, base: Any) -> bool:
    return base is float or (base is int and isinstance(value, int))


def ranged(init):
    """Check ``init``'s annotated ranges on every call (a class built from Python, not through the harness)."""
    signature = inspect.signature(init)
    hints = functools.cache(lambda: typing.get_type_hints(init, include_extras=True))  # names exist at a call

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        for name, value in signature.bind(self, *args, **kwargs).arguments.items():
            bad = violated(value, hints().get(name))
            if bad:
                raise ConfigError(f"{name}={value} must be {bad.words}")
        return init(self, *args, **kwargs)

    return checked
