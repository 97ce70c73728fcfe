"""Ranges and types declared where a parameter is: ``init_std: NonNegative = 0.02``, ``mlp_width: PositiveInt = 32``.

A constructor's signature is the schema of its config node (harness/config/values.py), so a range
written into its annotation is checked when the config is loaded, before anything is built, for our
classes and a user's alike, with the node's full key (``pos.init_std=-1 must be a number ≥ 0``).
``@ranged`` on ``__init__`` checks the same annotations when the class is built from Python.
Checks a range cannot say (an even count, one value above another) stay in the constructor.
``check_value`` (a value against its annotation: its type, a Literal's choices, finiteness, the range; the
loading's check of every config value) and ``check_fields`` (a dataclass's every field, for classes built
from Python) live here too: one home, one wording, for the rule written on a field.

The ground: imports only harness.errors.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import math
import types
import typing
from typing import Annotated, Any, Literal

from harness.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Range:
    """A closed or open interval for a number; ``words`` say it in a message ("a positive integer")."""

    words: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    le: float | None = None
    verb: str = "be"  # "must be a positive integer", "must lie in [0, 1)"
    plural: str = ""  # "positive integers": a list's items that break it ("[-5] are not positive integers")
    said: str = ""  # the whole predicate where "must be …" does not say it ("is more steps than any run takes; …")

    @property
    def must(self) -> str:
        return self.said or f"must {self.verb} {self.words}"

    def holds(self, value: float) -> bool:
        return math.isfinite(value) and (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )


Positive = Annotated[float, Range("a positive number", gt=0)]
NonNegative = Annotated[float, Range("a number ≥ 0", ge=0)]
PositiveInt = Annotated[int, Range("a positive integer", ge=1, plural="positive integers")]
NonNegativeInt = Annotated[int, Range("≥ 0", ge=0, plural="integers ≥ 0")]
DropoutRate = Annotated[float, Range("in [0, 1)", ge=0, lt=1, verb="lie")]
SignificanceLevel = Annotated[float, Range("a level in (0, 1)", gt=0, lt=1)]
FLOAT32_MAX = 3.4028234663852886e38
# a value a scheme writes into a float32 parameter (an initial bias, a learned scale): beyond float32, torch
# stops at the real construction with an overflow, which the checks' meta build does not meet
_FLOAT32 = Range(
    "within float32's range, |x| ≤ 3.4e38 (it starts a float32 parameter)", ge=-FLOAT32_MAX, le=FLOAT32_MAX
)
Float32 = Annotated[float, _FLOAT32]
PositiveFloat32 = Annotated[Positive, _FLOAT32]  # a positive number first, then float32's range
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
        if base in (int, float) and fits(value, base):  # a range bounds a number
            return next((r for r in meta if isinstance(r, Range) and not r.holds(value)), None)
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return next((r for r in (violated(value, a) for a in args) if r), None)
    if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
        per_item = args[:1] * len(value) if origin is list or args[-1] is Ellipsis else args
        return next((r for v, a in zip(value, per_item, strict=False) if (r := violated(v, a))), None)
    return None


def ranged(init):
    """Check ``init``'s annotated ranges, ``Literal`` choices and ``bool`` flags on every call (a class built from
    Python, not through the harness)."""
    signature = inspect.signature(init)
    hints = functools.cache(lambda: typing.get_type_hints(init, include_extras=True))  # names exist at a call

    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        for name, value in signature.bind(self, *args, **kwargs).arguments.items():
            hint = hints().get(name)
            if typing.get_origin(hint) is Literal or hint is bool:
                check_value(name, value, hint)  # layout='x': use interleaved or half; hope=1 must be true or false
            bad = violated(value, hint)
            if bad:
                raise ConfigError(f"{name}={value} {bad.must}")
        return init(self, *args, **kwargs)

    return checked


# ---------------------------------------------------------------- one value against one annotation


def check_value(key: str, value: Any, annotation: Any) -> None:
    """Raise a one-line ConfigError if ``value`` (a plain YAML value) does not fit ``annotation``; a list's items
    that do not are named (``eval.lengths=[128, -5]: [-5] are not positive integers``)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return
    item = _list_item(annotation)
    if item is not None and isinstance(value, (list, tuple)):
        wrong = [
            v
            for v in value
            if not fits(v, item) or (isinstance(v, float) and not math.isfinite(v)) or violated(v, item)
        ]
        if wrong:
            words = _describe_items(item)
            raise ConfigError(f"{key}={show_value(value)}: {wrong} are not {words}; give {words} only")
    if not fits(value, annotation):
        if typing.get_origin(annotation) is Literal:  # a closed set of words: name them all
            raise ConfigError(f"{key}={show_value(value)}: use {_or([str(a) for a in typing.get_args(annotation)])}")
        if isinstance(value, float) and value.is_integer() and fits(int(value), annotation):  # 1e5 is a float
            raise ConfigError(f"{key}={show_value(value)} must be {describe(annotation)}: write {key}={int(value)}")
        raise ConfigError(f"{key}={show_value(value)} must be {describe(annotation)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={show_value(value)} must be a finite number")
    bad = violated(value, annotation)  # a range declared in the annotation
    if bad:
        none = " (or null)" if fits(None, annotation) and "null" not in bad.words else ""
        raise ConfigError(f"{key}={show_value(value)} {bad.must}{none}")


def _list_item(annotation: Any) -> Any:
    """The item annotation of ``list[X]`` (through ``Annotated`` and ``| None``), else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _list_item(args[0])
    if origin in (typing.Union, types.UnionType):
        return next((i for i in (_list_item(a) for a in args) if i is not None), None)
    return args[0] if origin is list and args else None


def _describe_items(item: Any) -> str:
    """Words for many values of ``item``: its range's plural ("positive integers"), else its type's."""
    ranges = [r for r in typing.get_args(item) if isinstance(r, Range)]  # only ``Annotated`` carries a Range
    return next((r.plural for r in ranges if r.plural), describe(item, plural=True))


INT64_MAX = 2**63 - 1  # torch (and numpy) hold an integer argument in 64 bits; a larger one overflows in C++


def check_magnitude(key: str, value: Any, annotation: Any) -> None:
    """An integer (or a list's) beyond 64 bits is refused before a constructor hands it to torch, whose overflow
    is a traceback (``pos.npos=99999999999999999999``); where a float was meant, the fix says how to write one."""
    items = value if isinstance(value, (list, tuple)) else [value]
    big = next((v for v in items if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX), None)
    if big is None:
        return
    as_float = fits(1.5, annotation) and annotation not in (Any, inspect.Parameter.empty)
    fix = f"write it as a float, e.g. {float(big):.0e}" if as_float else "give a smaller value"
    raise ConfigError(f"{key}={show_value(value)} is beyond a 64-bit integer (at most 2^63 − 1); {fix}")


def check_fields(obj: object, prefix: str) -> None:
    """Every field of the dataclass ``obj`` against its annotation (type, choices, finiteness, range), as the
    config is checked when loaded: a class built from Python is held to the same rules, in the same
    words (``model.dropout=1.5 must lie in [0, 1)``). Its ``__post_init__`` adds only rules across fields."""
    for name, annotation in field_hints(type(obj)).items():
        check_value(f"{prefix}.{name}" if prefix else name, getattr(obj, name), annotation)


_HINTS: dict[type, dict[str, Any]] = {}


def field_hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their annotations, ranges (``Annotated``) kept (read once per class)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls, include_extras=True)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


# the YAML scalars' annotations and the Python types that fit each (an integer is a fine float)
_SCALARS: dict[Any, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    type(None): (type(None),),
    None: (type(None),),
}


def fits(value: Any, annotation: Any) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:  # a declared range (harness/ranges.py): the type is the first argument
        return fits(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args) or (
            isinstance(value, int) and not isinstance(value, bool) and value in args
        )
    if origin in (list, tuple, collections.abc.Sequence):  # typing.Sequence's origin is collections.abc's
        return isinstance(value, (list, tuple)) and _items_fit(value, origin, args)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation in _SCALARS:  # a bool is an int to isinstance: it fits bool only
        return isinstance(value, _SCALARS[annotation]) and (annotation is bool or not isinstance(value, bool))
    if origin is collections.abc.Callable:
        return False  # no plain YAML value is callable: an object comes as a node with _target_, checked as one
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # a typing construct we do not model (TypeVar): accept


def _items_fit(value, origin, args) -> bool:
    if not args:
        return True
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args, strict=True))
    return all(fits(v, args[0]) for v in value)


def describe(annotation: Any, plural: bool = False) -> str:
    """Words for what fits ``annotation``, e.g. "an integer or null", "a list of numbers"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return describe(args[0], plural)
    if origin in (typing.Union, types.UnionType):
        shown = [describe(a, plural) for a in args if a is not type(None) and _yaml_type(a)]
        return " or ".join(dict.fromkeys(shown)) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is collections.abc.Callable:
        return "config nodes with _target_" if plural else "a config node with _target_"
    if origin in (list, tuple) or origin is collections.abc.Sequence:
        item = f" of {describe(args[0], plural=True)}" if args and args[-1] is not Ellipsis or len(args) == 2 else ""
        return ("lists" if plural else "a list") + item
    names = {
        bool: ("true or false", "booleans"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        str: ("a string", "strings"),
        dict: ("a mapping", "mappings"),
        type(None): ("null", "nulls"),
    }
    name = getattr(annotation, "__name__", str(annotation))
    return names.get(annotation, (f"a {name}", f"{name}s"))[plural]


def _yaml_type(annotation: Any) -> bool:
    """Can a YAML value be of this type? (A Tensor in ``float | Tensor`` cannot: leave it out of messages.)"""
    return not isinstance(annotation, type) or annotation in (bool, int, float, str, dict, list, tuple)


def _or(words: list[str]) -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def show_value(value: Any) -> str:
    """``value`` as a message writes it after ``key=``: a string quoted, so ``'1'`` reads apart from ``1``."""
    return repr(value) if isinstance(value, str) else str(value)
