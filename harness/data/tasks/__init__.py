"""Position-sensitive synthetic tasks (conf/task/<name>.yaml), generated from the seed, no download.

Owns: one module per task, named as its option (conf/task/<name>.yaml ↔ harness/data/tasks/<name>.py,
``SyntheticTask.config_name()``), what every task shares (base.py: forms, datasets, exact match, the
``ScoredTask`` protocol and its ``TaskResults``; each option room's interface is its ``base``, as
positional/base.py and attention/base.py), a task's
position-blind baseline (blind.py), and the string helpers of copy and reverse (strings.py).
Adding a task is one module (associative_recall.py is the smallest to copy), one YAML naming its class as
``_target_`` and its tests; nothing here lists the tasks. Imports only harness.data (objectives,
tokenizer) and harness.errors; the training pipeline imports this package, never the other way round.
"""

from harness.data.tasks.base import (
    EVAL_SEED,
    FORM_FIELDS,
    Layout,
    ScoredExample,
    ScoredTask,
    SyntheticTask,
    TaskExamples,
    TaskResults,
    exact_match,
    string_hits,
    token_hits,
)

__all__ = [
    "EVAL_SEED",
    "FORM_FIELDS",
    "Layout",
    "ScoredExample",
    "ScoredTask",
    "SyntheticTask",
    "TaskExamples",
    "TaskResults",
    "exact_match",
    "string_hits",
    "token_hits",
]
