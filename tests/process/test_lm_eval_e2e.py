"""``posbench hf-eval --lm-eval``: lm-evaluation-harness's tasks on an exported posbench model, unscaled and under a
scaling, offline, logged to MLflow beside hf-eval's own measures — and the same responses as lm-eval's own route
(``lm_eval --model hf --model_args pretrained=DIR``) on the folder, and on the folder saved with that scaling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

TASK, LENGTH, DOCS = "niah_single_1", 512, 2  # RULER's single needle in a repeated-sentence haystack: no download


def model_args(folder: Path) -> str:
    return f"pretrained={folder},dtype=float32,max_length={LENGTH + 128}"


def lm_eval_task_manager(folder: Path):
    """lm-eval's task index as its command line builds it for ``folder`` (the model's arguments and --metadata; the
    RULER documents are made with that folder's tokenizer), over the folder of lm-eval's own task tree that defines
    ``TASK``: the same YAML file and functions, without parsing the thousands of other tasks' files."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    ruler = Path(lm_eval.tasks.__file__).parent / "ruler"
    metadata = simple_parse_args_string(model_args(folder)) | {"max_seq_lengths": [LENGTH]}
    return TaskManager(include_path=ruler, include_defaults=False, metadata=metadata)


def lm_eval_own_route(folder: Path, manager) -> list[dict]:
    """The samples (prompt, response, score) of lm-eval's Hugging Face backend loading ``folder`` itself, as its
    command line does, with the task index ``manager``."""
    import lm_eval

    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=model_args(folder),
        tasks=[TASK],
        task_manager=manager,
        samples={TASK: list(range(DOCS))},
        device="cpu",
        batch_size=1,
    )
    return out["samples"][TASK]


def responses(samples: list[dict]) -> list[str]:
    return [s["resps"][0][0] for s in samples]


def test_an_export_and_its_scaled_cell_score_as_lm_evals_own_command(train_tiny, store, monkeypatch):
    from harness.main import main

    summary, client = train_tiny("model=modern", "task=clm", "export=hf", "trainer.max_steps=6")
    folder = Path(client.download_artifacts(summary.run_id, "hf_model"))
    argv = ["posbench", "hf-eval", str(folder), "--scalings", "none,linear", "--factors", "2"]
    argv += ["--lengths", str(LENGTH), "--budget", str(LENGTH), "--passkey-trials", "0", "--key-short", "0"]
    monkeypatch.setattr("sys.argv", [*argv, "--lm-eval", TASK, "--lm-eval-limit", str(DOCS), "--tracking-uri", store])
    assert main() == 0

    runs = client.search_runs([client.get_experiment_by_name("hf-eval").experiment_id])
    cells = {r.data.tags["scaling"]: r for r in runs if "scaling" in r.data.tags}
    said = {}
    for scaling, run in cells.items():
        assert run.info.status == "FINISHED"
        assert 0 <= run.data.metrics[f"lm_eval/{TASK}_at_{LENGTH}"] <= 100
        text = Path(client.download_artifacts(run.info.run_id, "lm_eval_samples.jsonl")).read_text()
        rows = [json.loads(line) for line in text.splitlines()]
        assert [r["task"] for r in rows] == [TASK] * DOCS and all(r["target"] for r in rows)
        said[scaling] = [r["response"] for r in rows]

    scaled = shutil.copytree(folder, folder.parent / "linear2")
    config = json.loads((scaled / "config.json").read_text())
    theta = config["rope_parameters"]["rope_theta"]
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": theta}
    (scaled / "config.json").write_text(json.dumps(config))
    # one task index for both folders: the scaled copy's tokenizer files are the folder's, so are its documents
    manager = lm_eval_task_manager(folder)
    own = lm_eval_own_route(folder, manager)
    assert responses(own) == said["none"]
    assert responses(lm_eval_own_route(scaled, manager)) == said["linear"]
    assert said["none"] != said["linear"]  # the scaling reached the generation

    # hf-eval --tasks' own route (greedy decoding, RULER's string_match_all) on lm-eval's documents: the same
    # responses and the same scores as lm-eval's
    from harness.data.tasks.ruler import string_match_all
    from harness.pretrained.folder import tokenizer
    from harness.pretrained.hf_eval import load
    from harness.pretrained.measures import greedy

    model, encode = load(folder)
    eos = tokenizer(folder).eos_token_id
    for sample in own:
        ids = greedy(model, encode(sample["arguments"][0][0])[-LENGTH:], 128)
        text = tokenizer(folder).decode(ids[: ids.index(eos)] if eos in ids else ids)
        assert text == sample["resps"][0][0]
        assert string_match_all(text, sample["doc"]["outputs"]) == sample[str(LENGTH)]
