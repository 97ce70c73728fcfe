"""Several tasks in one training run, each scored on its own (``task=mixture``).

Each training example is one part's, the part drawn uniformly; a part keeps its own layout, form and lengths,
and writes its strings in an alphabet of its own, disjoint from the others', so the symbols tell the model which
function to compute (no marker token: every part's sequence, and so its positions, is exactly that task's).
The final evaluation scores every part on its own evaluation sets, at the training lengths
(``val/<part>/acc``, ``val/<part>/token_acc``) and at each ``task.eval_lengths`` entry
(``val/<part>/acc_at_<L>``, ``val/<part>/token_acc_at_<L>``, its position-blind baseline beside them), as if it
had trained alone; ``val/acc`` and ``val/acc_at_<L>`` pool the parts.

Why: a preset that compares schemes on four tasks trains one model per scheme and seed instead of four, which is
what lets Ruoss et al. 2023's comparison (harness' experiment=randomized_positions) fit a 2-core CPU. It is a
deviation from the papers, which train one model per task: a part may help or hinder another, so a claim judged
on a mixture says so (the preset's claim names it).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from harness.data.tasks.base import Layout, SyntheticTask
from harness.errors import ConfigError

# each part's symbols when task.alphabets does not name them: pairwise disjoint, the binary tasks binary and
# bucket sort with five symbols (Ruoss et al. 2023's vocabulary sizes)
ALPHABETS = {"reverse": "01", "copy": "23", "missing_duplicate": "45", "sort": "abcde"}


def _part_class(name: str) -> type[SyntheticTask]:
    """The task class of conf/task/<name>.yaml, found by the one-module-per-task rule (harness/data/tasks/), or
    a class of the user's own by its dotted path (``mypkg.tasks.Shift``, its part named by its module)."""
    if isinstance(name, str) and "." in name:
        module_name, _, class_name = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            raise ConfigError(f"task.parts: cannot import {name!r}; put its package on PYTHONPATH") from None
        if not (isinstance(cls, type) and issubclass(cls, SyntheticTask)) or cls is Mixture:
            raise ConfigError(f"task.parts: {name} is not a SyntheticTask (harness/data/tasks/base.py)")
        return cls
    if not isinstance(name, str) or not name.isidentifier() or name == "mixture":
        raise ConfigError(f"task.parts entry {name!r} is not a task name; use e.g. task.parts=[reverse,copy]")
    try:
        module = importlib.import_module(f"harness.data.tasks.{name}")
    except ModuleNotFoundError:
        raise ConfigError(
            f"task.parts: no task {name!r} (harness/data/tasks/{name}.py); python run.py --list names the tasks"
        ) from None
    found = [
        c
        for c in vars(module).values()
        if isinstance(c, type)
        and issubclass(c, SyntheticTask)
        and c.__module__ == module.__name__
        and c.config_name() == name
    ]
    if len(found) != 1:
        raise ConfigError(f"task.parts: harness/data/tasks/{name}.py defines no single task class")
    return found[0]


class Mixture(SyntheticTask):
    """One example of a part drawn uniformly; the length is the parts' own (the same unit for each: |w|)."""

    def __init__(
        self,
        tokenizer=None,
        form: str | None = None,
        parts: Sequence[str] = ("reverse", "copy"),
        alphabets: dict | None = None,
        train_lengths: Sequence[int] = (1, 20),
        eval_lengths: Sequence[int] = (5, 10, 20, 40, 80),
        eval_examples: int = 128,
    ):
        names = list(parts) if parts is not None and not isinstance(parts, str) else None
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"task.parts={parts!r} must list distinct task names, e.g. task.parts=[reverse,copy]")
        alphabets = dict(ALPHABETS, **(dict(alphabets) if alphabets else {}))
        self.parts: dict[str, SyntheticTask] = {}
        letters: dict[str, Tensor] = {}
        for entry in names:
            cls = _part_class(entry)
            name = cls.config_name() if "." in entry else entry
            if cls.needs_filler:
                raise ConfigError(f"task.parts: task={name} cuts corpus text, which a mixture does not hand it")
            takes = inspect.signature(cls).parameters
            if "alphabet" not in takes and not any(p.kind is p.VAR_KEYWORD for p in takes.values()):
                raise ConfigError(
                    f"task.parts: task={name} takes no task.alphabet, the symbols that tell a mixture's parts apart; "
                    "leave it out of task.parts"
                )
            if name not in alphabets:
                raise ConfigError(f"task.parts: give {name}'s symbols, e.g. +task.alphabets.{name}=xy")
            build: Callable[..., SyntheticTask] = cls  # a part's class takes alphabet= beyond SyntheticTask's own
            part = build(
                tokenizer,
                form,
                alphabet=alphabets[name],
                train_lengths=train_lengths,
                eval_lengths=eval_lengths,
                eval_examples=eval_examples,
            )
            if not hasattr(part, "alphabet"):  # built with alphabet=, a part keeps its symbols as (A,) byte ids
                raise ConfigError(f"task.parts: task={name} keeps no alphabet, which tells a mixture's parts apart")
            self.parts[name], letters[name] = part, part.alphabet
        symbols = [set(a.tolist()) for a in letters.values()]
        if sum(len(s) for s in symbols) != len(set().union(*symbols)):
            raise ConfigError(
                f"task.alphabets: the parts' symbols must be disjoint (they tell the model the task), "
                f"got { ({n: bytes(a.tolist()).decode() for n, a in letters.items()}) }"
            )
        forms = {p.form for p in self.parts.values()}
        if len(forms) != 1:
            raise ConfigError(f"task.parts: the parts take different forms by default ({sorted(forms)}); set task.form")
        super().__init__(tokenizer, forms.pop(), train_lengths, eval_lengths, eval_examples)  # a form of every part

    def min_length(self) -> int:
        return max(p.min_length() for p in self.parts.values())

    def layout_size(self, length: int) -> int:
        return max(p.layout_size(length) for p in self.parts.values())

    def layout(self, length: int, gen: torch.Generator, filler: Tensor | None = None) -> Layout:
        k = int(torch.randint(len(self.parts), (1,), generator=gen))
        lay = list(self.parts.values())[k].layout(length, gen)
        return Layout(lay.tokens, lay.answer, {"part": k})  # a part's own extras differ from the others'
