"""The run's model constructed once: on torch's ``meta`` device for the checks, then materialised by replaying
what its constructors did.

The validation pass needs the model on meta (every constructor check, the parameter count, the rehearsal) and
the build needs the same model with real weights, drawn exactly as a construction right after the seed draws
them: every committed result is reproduced by its command, so the initial weights may not change. Constructing
twice would run every constructor twice. Instead ``construct`` runs the constructors once, on meta, under a
``Recording``: the aten ops they call, in order, with their arguments (a meta tensor by its storage and view, a
host tensor by value). ``Deferred.materialize`` runs those ops again on the CPU after the seed: the same kernels
in the same order over the same random stream, so every parameter and buffer is bit-identical to a direct
construction's and the stream is left where a direct construction leaves it (tests/unit/test_deferred.py, every
scheme × variant). The real storages are then put into the modules that were constructed; a module that draws
something on the host from a value it made (Performer's projection, from its seed) does it in its
``materialized()``, called once its own tensors are real.

A sweep's preflight keeps each cell's construction (``Constructions``) for the cell to take when it runs in the
same process, so a sweep cell, too, is constructed once.

A constructor whose work the record cannot replay is noticed while recording and the model is then constructed
directly when materialised (``Deferred.replayable`` is False, with the reason): it drew random numbers on a real
device (the global generator at recording time is not the seeded one), drew from a ``torch.Generator`` of its
own, or kept a meta tensor that is neither a parameter nor a buffer (materialising could not reach it). A value
read on the host cannot come from a meta tensor (it has none) and one from a host tensor is drawn (noticed) or a
function of the constructor's arguments (the same when replayed). What the record cannot see is a constructor
that does something else *because* its tensors are on meta: that branch must be finished in ``materialized()``,
as Performer's is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)  # tensors made from Python data: not an aten op on meta


@dataclass(frozen=True)
class _Meta:
    """A meta tensor as an op saw it: its storage (kept alive by the record, so the key stays unique) and view."""

    storage: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, t: Tensor) -> _Meta:
        return cls(t.untyped_storage()._cdata, int(t.storage_offset()), tuple(map(int, t.shape)),
                   tuple(map(int, t.stride())), t.dtype)


@dataclass(frozen=True)
class _Value:
    """A host tensor an op read (a table computed from Python data): replayed as it was."""

    tensor: Tensor


class _MetaDevice:
    """``device=meta`` in an op's arguments: the device the record is materialised on."""


class Recording(TorchDispatchMode):
    """Every aten op run while it is active, in order, with the references ``_replay`` needs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []
        self.unreplayable: str | None = None  # why a replay would not reproduce the construction
        self._held: list = []  # the meta storages seen, kept alive so that no two share a key

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.unreplayable is None:
            self.unreplayable = _why_unreplayable(func, args, kwargs, out)
        self.ops.append((func, self._refs(list(args)), self._refs(kwargs), self._refs(out)))
        return out

    def _refs(self, tree):
        def ref(v):
            if isinstance(v, Tensor) and v.is_meta:
                self._held.append(v.untyped_storage())
                return _Meta.of(v)
            if isinstance(v, Tensor):
                return _Value(v.detach().clone())
            if isinstance(v, torch.device) and v.type == "meta":
                return _MetaDevice()
            return v
        return tree_map(ref, tree)


def _why_unreplayable(func, args, kwargs, out) -> str | None:
    if any(isinstance(v, torch.Generator) for v in tree_flatten((args, kwargs))[0]):
        return f"a constructor drew from its own torch.Generator ({func})"
    if torch.Tag.nondeterministic_seeded in func.tags:
        made = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        if any(not t.is_meta for t in made):
            return f"a constructor drew random numbers on {made[0].device} ({func})"
    return None


class _FromData(TorchFunctionMode):
    """``torch.tensor(data)`` under the meta device keeps no values and runs no op the record sees: make it on the
    host, then copy it to meta (an op, recorded with the host tensor it copies)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_DATA and kwargs.get("device") is None:
            return func(*args, **{**kwargs, "device": "cpu"}).to("meta")
        return func(*args, **kwargs)


@dataclass
class Deferred:
    """A model constructed on meta (``meta``, for the checks: change it freely) and how to make it real."""

    meta: nn.Module
    make: Callable[[], nn.Module]
    recording: Recording
    _pristine: nn.Module | None

    @property
    def replayable(self) -> bool:
        return self.recording.unreplayable is None

    def materialize(self) -> nn.Module:
        """The model with real weights on the CPU, as ``make()`` would construct it now; once."""
        if not self.replayable or self._pristine is None:
            return self.make()
        model, self._pristine = self._pristine, None
        with torch.no_grad():
            storages = _replay(self.recording.ops)
            _swap_in(model, storages)
            for module in model.modules():
                finish = getattr(module, "materialized", None)
                if callable(finish):
                    finish()
        self.recording.ops.clear()
        return model


class Constructions:
    """The models a sweep's preflight constructed (``keeping``), for its cells in this process to take, each once:
    a cell launched here is then constructed once, not again after its check. A launcher's worker process
    (joblib, SLURM) gets none and constructs its own."""

    def __init__(self, keeping: bool = False):
        self.keeping = keeping
        self._by_key: dict[str, list[Deferred]] = {}

    def __getstate__(self) -> dict:
        return {"keeping": False, "_by_key": {}}

    def construct(self, key: str, make: Callable[[], nn.Module]) -> Deferred:
        """``make()`` constructed (and kept, when keeping), or the one kept for ``key``: a record depends only on
        what ``key`` says (the model, pos and attn nodes, the sizes), never on the seed."""
        kept = self._by_key.get(key)
        if kept and not self.keeping:
            return kept.pop()
        deferred = construct(make)
        if self.keeping:
            self._by_key.setdefault(key, []).append(deferred)
        return deferred


def construct(make: Callable[[], nn.Module]) -> Deferred:
    """``make()`` run once on meta under a ``Recording``."""
    recording = Recording()
    with torch.device("meta"), _FromData(), recording:
        model = make()
    loose = next((f"{type(m).__name__}.{name}" for m in model.modules() for name, v in vars(m).items()
                  if isinstance(v, Tensor) and v.is_meta), None)  # a host one is kept as it is, like a host buffer
    if loose and recording.unreplayable is None:
        recording.unreplayable = f"{loose} is a meta tensor that is neither a parameter nor a buffer"
    # the checks run forwards on ``meta``, which may set state (a cache, a generator); the record fills its twin
    return Deferred(copy.deepcopy(model), make, recording, model if recording.unreplayable is None else None)


def _replay(ops: list) -> dict[int, torch.UntypedStorage]:
    """Each recorded op again on the CPU; returns the real storage of each meta storage."""
    storages: dict[int, torch.UntypedStorage] = {}

    def real(v):
        if isinstance(v, _Meta):
            return _view(storages[v.storage], v)
        if isinstance(v, _Value):
            return v.tensor
        if isinstance(v, _MetaDevice):
            return torch.device("cpu")
        return v

    leaf = lambda v: isinstance(v, (_Meta, _Value, _MetaDevice))  # noqa: E731
    for func, args, kwargs, out in ops:
        result = func(*tree_map(real, args, is_leaf=leaf), **tree_map(real, kwargs, is_leaf=leaf))
        for made, t in zip(tree_flatten(out, is_leaf=leaf)[0], tree_flatten(result)[0], strict=True):
            if isinstance(made, _Meta):
                storages[made.storage] = t.untyped_storage()
    return storages


def _view(storage: torch.UntypedStorage, v) -> Tensor:
    return torch.empty(0, dtype=v.dtype).set_(storage, v.offset, v.shape, v.stride)


def _swap_in(model: nn.Module, storages: dict[int, torch.UntypedStorage]) -> None:
    """Each parameter and buffer of ``model`` (a tensor shared by two modules stays shared) made real."""
    parameters: dict[int, nn.Parameter] = {}
    buffers: dict[int, Tensor] = {}

    def of(t: Tensor) -> Tensor:
        if not t.is_meta:
            return t
        v = _Meta.of(t)
        return _view(storages[v.storage], v)

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in parameters:
                    parameters[id(p)] = nn.Parameter(of(p.data), requires_grad=p.requires_grad)
                module._parameters[name] = parameters[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                if id(b) not in buffers:
                    buffers[id(b)] = of(b)
                module._buffers[name] = buffers[id(b)]
