"""Room: the run record — everything a run leaves in MLflow and beside its checkpoints.

Owns: the tracking store and its one client, retrying and checking each closed run's record against the seal
written when it closed (``store``, ``retry``, ``seal``), the one owner of a run's
life and only writer of its status (``run``: ``TrackedRun``), the Lightning logger that writes
through it (``logger``), exact resume (``resume``: config hash, plan, lock) and the files and
callbacks beside checkpoints (``checkpoints``), and the reconciliation of runs whose process died
(``reconcile``).

May import: the ground only (harness.errors, harness.paths).
"""
