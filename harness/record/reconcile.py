"""Runs left RUNNING by a process that died without closing them (SIGKILL, OOM killer, power loss).

Two ways to know a RUNNING run is dead, each checked when a later process starts on the same store:
- ``close_dead_runs``: the run's ``host`` tag is this machine and its ``pid`` no longer exists
  (any run, whatever its config: plain runs, sweep cells, sweep parents);
- ``close_stale_runs``: the run trains the same config (tag ``config_hash``) and the config's lock is
  free — the kernel drops a flock when its holder dies, even by SIGKILL, on any host sharing the
  filesystem.
Both close the run FAILED with ``failure=killed`` and a reason naming who found it.
"""

from __future__ import annotations

import os
import socket

from harness.record.run import mark_failed
from harness.record.store import Store

KILLED_REASON = (
    "the process training this run died without closing it (SIGKILL, OOM or power loss); "
    "found RUNNING with no live process by {by}"
)


def close_stale_runs(store: Store, experiment: str, config_hash: str, keep: str | None, by: str) -> list[str]:
    """This config's RUNNING runs other than ``keep``. Call only while holding the config's lock,
    i.e. when no live process (on this filesystem) trains it."""
    runs = store.search(experiment, f"tags.config_hash = '{config_hash}' and attributes.status = 'RUNNING'")
    return _close([r for r in runs if r.info.run_id != keep], store, by)


def close_dead_runs(store: Store, experiment: str, keep: str | None = None) -> list[str]:
    """RUNNING runs of ``experiment`` owned by a process of this host that no longer exists."""
    host = socket.gethostname()
    runs = store.search(experiment, "attributes.status = 'RUNNING'")
    dead = [
        r
        for r in runs
        if r.info.run_id != keep
        and r.data.tags.get("host") == host
        and r.data.tags.get("pid", "").isdigit()
        and not alive(int(r.data.tags["pid"]))
    ]
    return _close(dead, store, "a later start on this store (its process is gone)")


def _close(runs: list, store: Store, by: str) -> list[str]:
    for run in runs:
        mark_failed(store, run.info.run_id, "killed", KILLED_REASON.format(by=by))
        print(
            f"reconciled: MLflow run {run.info.run_id} was left RUNNING by a dead process; now FAILED (failure=killed)"
        )
    return [r.info.run_id for r in runs]


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
