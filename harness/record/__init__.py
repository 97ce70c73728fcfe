"""Room: the run record — everything a run leaves in MLflow and beside its checkpoints.

Owns: the tracking store and its one client, retrying and checking each closed run's record against the seal
written when it closed (``store``: where the store is and the client that writes it, as results/store.py is the
one that reads a sweep back), what every command checks before it works, the store, the folder it
writes and the numbers its flags carry (``preflight``), the one owner of a run's life and only writer of its
status, which also closes the runs whose process died (``run``: ``TrackedRun``), exact resume (``resume``: config
hash, plan, lock, the files beside checkpoints), and the Lightning logger that writes through the run with the
Lightning callbacks of exact resume (``callbacks``).

May import: the ground only.
"""
