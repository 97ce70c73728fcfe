"""Room: the run record — everything a run leaves in MLflow and beside its checkpoints.

Owns: the tracking store and its one client, retrying and checking each closed run's record against the seal
written when it closed (``store``: where the store is and the client that writes it, as results/store.py is the
one that reads a sweep back; ``retry``), what every command checks before it works, the store, the folder it
writes and the numbers its flags carry (``preflight``), the one owner of a run's life and only writer of its
status (``run``: ``TrackedRun``), the Lightning logger that writes through it (``logger``), exact resume
(``resume``: config hash, plan, lock), the files beside checkpoints (``checkpoints``) and the Lightning callbacks
of exact resume (``callbacks``), and the reconciliation of runs whose process died (``reconcile``).

May import: the ground only.
"""
