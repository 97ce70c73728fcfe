"""lm-evaluation-harness tasks on a model hf-eval holds in memory, under the cell's scaling: ``--lm-eval``.

The tasks are lm-eval's own (``lm_eval --model hf``'s scoring, prompts and answer matching), run on the loaded model
through its ``HFLM`` wrapper, so a posbench cell and ``lm_eval --model hf --model_args pretrained=DIR`` on a folder
saved with the same ``rope_parameters`` give the same responses. The RULER tasks that generate their data
(``niah_single_1``, ``ruler_vt``, ``ruler_fwe``, ``ruler_cwe``; RULER, Hsieh et al. 2024) need no download and are
sized by the model's tokenizer to each ``--lengths`` value; lm-eval scores them as RULER does (the share of the
expected strings found in the generated answer). Each (task, metric) is logged as ``lm_eval/<task>_at_<L>`` for a
length-named RULER metric, else ``lm_eval/<task>/<metric>``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
from pathlib import Path

from harness.errors import ConfigError
from harness.extras import require

GENERATED = 128  # RULER's longest answer (max_gen_toks of its needle tasks): room kept beyond the prompt's length


@functools.cache
def build(folder: Path, names: tuple[str, ...], lengths: tuple[int, ...]):
    """(lm-eval's task manager, the tasks built: RULER's data generated at each length with ``folder``'s tokenizer),
    before any weight is loaded; a task lm-eval lacks or cannot fit at a length is a ConfigError."""
    require("--lm-eval", ("lm_eval",))
    import transformers
    from lm_eval import tasks as lm_eval_tasks

    transformers.utils.logging.set_verbosity_error()
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    metadata = {"max_seq_lengths": list(lengths), "tokenizer": str(folder)}
    # RULER's folder of lm-eval's tasks alone when it holds every name: indexing all the tasks lm-eval ships reads
    # every one's YAML file, seconds spent on tasks that are not loaded
    ruler = Path(lm_eval_tasks.__file__).parent / "ruler"
    manager = lm_eval_tasks.TaskManager(include_defaults=False, include_path=ruler, metadata=metadata)
    if not all(n in manager.all_tasks for n in names):
        manager = lm_eval_tasks.TaskManager(metadata=metadata)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"--lm-eval={','.join(names)}: {', '.join(unknown)} is no lm-eval task; offline ones: niah_single_1, "
            "ruler_vt, ruler_fwe, ruler_cwe (`lm_eval ls tasks` lists them all)"
        )
    try:  # quiet: RULER's import asks nltk for a download it does not need offline, and says so on stdout/stderr
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return manager, list(manager.load(list(names))["tasks"].values())
    except ValueError as e:  # RULER: a length too short for its template and answer
        raise ConfigError(
            f"--lm-eval={','.join(names)} at --lengths {','.join(map(str, lengths))}: {str(e).split('. ')[0]}; give "
            "longer --lengths (the task's template and answer must fit) or leave the task out"
        ) from None


def first(docs, limit: int) -> list[int]:
    """The first ``limit`` documents' indices at each length (RULER's docs say theirs: ``max_length``), else the
    first ``limit``: lm-eval's own ``--limit`` would take them all from the shortest length."""
    seen: dict[object, int] = {}
    chosen = []
    for i, doc in enumerate(docs):
        length = doc.get("max_length") if isinstance(doc, dict) else None
        if seen.get(length, 0) < limit:
            seen[length] = seen.get(length, 0) + 1
            chosen.append(i)
    return chosen


def scores(model, folder: Path, names: tuple[str, ...], lengths: tuple[int, ...], limit: int, seed: int):
    """(metrics, the samples as JSON lines: task, target, response, the prompt's tail) of the tasks on ``model``
    with ``folder``'s tokenizer, ``limit`` documents per task (and per length for RULER's)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    from harness.pretrained.folder import tokenizer

    manager, tasks = build(folder, names, lengths)
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tokenizer(folder), max_length=max(lengths) + GENERATED, batch_size=1),
        tasks=tasks,
        task_manager=manager,
        samples={task.task_name: first(task.eval_docs, limit) for task in tasks},
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        log_samples=True,
    )
    metrics: dict[str, float] = {}
    for task, values in out["results"].items():
        for key, value in values.items():
            metric, _, _ = key.partition(",")
            if not isinstance(value, int | float) or metric.endswith("_stderr") or metric == "sample_len":
                continue
            if not metric.isdigit():
                metrics[f"lm_eval/{task}/{metric}"] = float(value)
            elif int(metric) in lengths:  # a RULER length: only those asked (the others read -1)
                metrics[f"lm_eval/{task}_at_{metric}"] = float(value)
    samples = [
        {"task": task, "target": s["target"], "response": s["resps"][0][0], "prompt_tail": s["arguments"][0][0][-120:]}
        for task, rows in out["samples"].items()
        for s in rows
    ]
    return metrics, "".join(json.dumps(s) + "\n" for s in samples)
