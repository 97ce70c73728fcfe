"""A closed run's record, sealed: what reports, resume and adoption read back is checked against digests written
when the run closed.

sqlite checks its pages' structure (``damage_of``), not the values in them: a flipped byte in a stored metric,
param or tag reads back as another number, and a report or a verdict would be computed from it. So when a run
closes, ``seal`` reads its record back and writes tag ``posbench.seal``: digests of its status, params, tags (the
keys sealed are listed, so a tag added later is no damage), latest metric values, and each metric's history.
``SealedClient``, the store's client, checks every run it returns (``get_run``, ``search_runs``) and every history
(``get_metric_history``) against its seal, and refuses a mismatch in one line naming the run and the fix
(``RecordDamaged``). A run without a seal (from before seals, or still RUNNING) is read as it is; a damaged
seal key is caught as well (one character off ``posbench.seal``).

Not sealed: the run's name and its description (``mlflow.runName``, ``mlflow.note.content``: the dashboard
edits them). A run written again after it closed (resumed: the seal is dropped when it reopens; adopted by a
sweep: sealed again after its new tags) carries the seal of its last write.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from harness.errors import ConfigError
from harness.sealed import near_miss

SEAL_TAG = "posbench.seal"
MARK_TAG = "posbench.sealed_when_closed"  # set when posbench creates a run: closed without a seal, it was damaged
CLOSED = ("FINISHED", "FAILED", "KILLED")
UNSEALED = ("mlflow.runName", "mlflow.note.content", SEAL_TAG)  # a user may edit these in the dashboard
MAX_SEAL_CHARS = 7500  # under MLflow's 8,000 per tag value; past it, one digest over every history


class RecordDamaged(ConfigError):
    """A run's record in the store differs from its seal; ``str`` is the one line."""

    def __init__(self, line: str, run_id: str = ""):
        super().__init__(line)
        self.run_id = run_id


_WARNED: set[str] = set()  # runs a warning has named in this process: a sweep's cell meets one twice (adopt, resume)


def warn(damaged: RecordDamaged, then: str) -> None:
    """``warning: <the line>; <then>`` on stderr, once per run and process (where a sweep goes on without it)."""
    if damaged.run_id not in _WARNED:
        _WARNED.add(damaged.run_id)
        print(f"warning: {damaged}; {then}", file=sys.stderr)


def seal(client: Any, run_id: str) -> None:
    """Write the seal of run ``run_id`` as the store holds it now (after its last write)."""
    raw = getattr(client, "raw", client)  # the record as it is: it may differ from an older seal (adoption)
    run = raw.get_run(run_id)
    body = _digests(run, {key: raw.get_metric_history(run_id, key) for key in run.data.metrics})
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SEAL_CHARS:
        body["history"] = _digest(body["history"])
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    raw.set_tag(run_id, SEAL_TAG, text)


def _digests(run, histories: dict[str, list]) -> dict:
    tags = {k: v for k, v in run.data.tags.items() if k not in UNSEALED}
    return {"v": 1, "status": run.info.status, "params": _digest(run.data.params), "tags": sorted(tags),
            "tag_values": _digest(tags), "latest": _digest(_floats(run.data.metrics)),
            "history": {key: _history(points) for key, points in sorted(histories.items())}}


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _floats(metrics: dict[str, float]) -> dict[str, str]:
    return {k: repr(float(v)) for k, v in metrics.items()}  # repr: exact, and NaN/inf as text


def _history(points) -> str:
    return _digest(sorted([m.step, m.timestamp, repr(float(m.value))] for m in points))


def _seal_of(run) -> dict | None:
    """The run's seal, or None (a run from before seals, or not yet closed); a run posbench created (``MARK_TAG``)
    that is closed without one was damaged."""
    tags = run.data.tags
    text = tags.get(SEAL_TAG)
    if text is None:
        near = next((k for k in tags if near_miss([k], SEAL_TAG)), None)
        if near is not None:
            raise _damaged(run, f"its seal's key reads {near!r}")
        if MARK_TAG in tags and run.info.status in CLOSED:
            raise _damaged(run, "its seal is gone (posbench seals every run it closes)")
        return None
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or body.get("v") != 1:
            raise ValueError
        return body
    except ValueError:
        raise _damaged(run, "its seal is unreadable") from None



def check_run(run) -> None:
    """``run``'s status, params, tags and latest metrics against its seal."""
    body = _seal_of(run)
    if body is None:
        return
    tags = run.data.tags
    missing = [k for k in body["tags"] if k not in tags]
    changed = ([f"tag {missing[0]!r} is gone"] if missing else []) + [
        what for what, ok in (
            ("its status", run.info.status == body["status"]),
            ("a param", _digest(run.data.params) == body["params"]),
            ("a tag", missing or _digest({k: tags[k] for k in body["tags"]}) == body["tag_values"]),
            ("a metric's latest value", _digest(_floats(run.data.metrics)) == body["latest"])) if not ok]
    if changed:
        raise _damaged(run, f"{changed[0]} differs from its seal")


def unsealed(runs) -> list[str]:
    """The ids of closed runs among ``runs`` that carry no seal: closed before posbench sealed run records, so their
    values are read unchecked (a report says how many)."""
    return [r.info.run_id for r in runs if r.info.status in CLOSED and SEAL_TAG not in r.data.tags]


def check_history(run, key: str, points: list, histories=None) -> dict[str, str]:
    """Metric ``key``'s history of ``run`` against its seal; ``histories()`` gives every key's, for a seal that
    holds one digest over all (a run with more metrics than a tag holds digests of). Returns the digest of each
    history found intact (so a caller checks one of them again without reading all)."""
    body = _seal_of(run)
    if body is None:
        return {}
    sealed = body["history"]
    if isinstance(sealed, str) and histories is not None:
        each = {k: _history(p) for k, p in sorted(histories().items())}
        sealed = each if _digest(each) == sealed else {}
    if isinstance(sealed, str) or not (key not in run.data.metrics and key not in sealed
                                       or sealed.get(key) == _history(points)):
        raise _damaged(run, f"metric {key!r}'s history differs from its seal")
    return sealed


def _damaged(run, what: str) -> RecordDamaged:
    name = run.data.tags.get("mlflow.runName", "")
    return RecordDamaged(
        f"run {run.info.run_id}{f' ({name})' if name else ''} in the tracking store is damaged: {what}, written "
        "when the run closed (a changed byte, or an edit outside posbench); restore the store from a copy, or delete "
        "that run in the dashboard and run its command again", run.info.run_id)


class SealedClient:
    """The store's client (``raw``), every run and history it reads checked against its seal."""

    def __init__(self, raw: Any):
        self.raw = raw
        self._intact: dict[tuple[str, str], dict[str, str]] = {}  # (run, its seal) -> each history's digest

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "raw":  # unpickling looks these up before ``raw`` exists
            raise AttributeError(name)
        return getattr(self.raw, name)

    def get_run(self, run_id: str):
        run = self.raw.get_run(run_id)
        check_run(run)
        return run

    def search_runs(self, *args, **kwargs):
        runs = self.raw.search_runs(*args, **kwargs)
        for run in runs:
            check_run(run)
        return runs

    def get_metric_history(self, run_id: str, key: str) -> list:
        points = self.raw.get_metric_history(run_id, key)
        run = self.raw.get_run(run_id)
        known = self._intact.get((run_id, run.data.tags.get(SEAL_TAG, "")))
        if known is not None and known.get(key) == _history(points):
            return points
        intact = check_history(run, key, points,
                               lambda: {k: self.raw.get_metric_history(run_id, k) for k in run.data.metrics})
        self._intact[run_id, run.data.tags.get(SEAL_TAG, "")] = intact
        return points
