"""Position-sensitive synthetic tasks (conf/task/<name>.yaml), generated from the seed, no download.

Owns: each task's layout and forms (base.py), the string tasks copy / reverse / missing_duplicate
(strings.py), multi-query associative recall (recall.py), passkey retrieval and its accuracy-by-depth
table (passkey.py). Imports only harness.data (objectives, tokenizer) and harness.errors; the
training pipeline imports this package, never the other way round.
"""

from harness.data.tasks.base import EVAL_SEED, Layout, SyntheticTask, TaskExamples, collate, exact_match
from harness.data.tasks.passkey import Passkey, depth_table, write_depth_table
from harness.data.tasks.recall import AssociativeRecall
from harness.data.tasks.strings import Copy, MissingDuplicate, Reverse

__all__ = ["EVAL_SEED", "AssociativeRecall", "Copy", "Layout", "MissingDuplicate", "Passkey", "Reverse",
           "SyntheticTask", "TaskExamples", "collate", "depth_table", "exact_match", "write_depth_table"]
