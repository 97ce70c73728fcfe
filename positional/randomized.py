"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", ACL, §3) as a wrapper any scheme's factory can take, rather than arguments every scheme repeats.

``randomized(factory, randomize=True, max_position=M)`` is ``factory`` (shape -> scheme) whose shape carries a
``Sampling``: each forward's T positions are then a sorted sample without replacement from [0, M), drawn once per
forward and handed to every hook (positional/base.py ``PositionalScheme.positions``); a learned table is M long; a
relative bias reads p_i − p_j. A scheme that reads no position index declares why (``randomize_refusal``) and is
refused. The config keys are ``pos.randomize``, ``pos.max_position`` and ``pos.eval_positions`` (conf/config.yaml
gives every pos node them; harness/config/instantiate.py hands them here), so a user's own scheme takes them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from positional.base import EvalPositions, PositionalScheme, Shape, check_sampling

KEYS = ("randomize", "max_position", "eval_positions")


def randomized(
    factory: Callable[[Shape], PositionalScheme],
    randomize: bool = False,
    max_position: int | None = None,
    eval_positions: EvalPositions | None = None,
    *,
    cls: object = None,
):
    """``factory`` (a scheme class, or a partial of one) with randomized positions when ``randomize``; checked
    against its class (``cls``, else the factory's own) and the shape when built (``check_sampling``: max_position ≥
    the training length, a scheme that reads positions, no stray key)."""
    scheme: Any = cls or (factory if isinstance(factory, type) else getattr(factory, "func", None))

    def build(shape: Shape) -> PositionalScheme:
        sampling = check_sampling(scheme, shape, randomize, max_position, eval_positions)
        return factory(shape if sampling is None else replace(shape, sampling=sampling))

    return build
