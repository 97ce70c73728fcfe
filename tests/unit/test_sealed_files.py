"""Every file posbench writes and later reads back is sealed (harness/integrity.py): a flipped byte, wherever it
falls, is refused in one line naming the file and the fix, before the content is used. One test per kind here;
the others live beside their writers (shards, manifests and their tokenizer.json: tests/unit/test_shards.py; cached
vocabularies: tests/unit/test_tokenizers.py; checkpoints: tests/unit/test_checkpoint_digest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import integrity
from harness.errors import ConfigError


def flipped(path: Path, at: float) -> None:
    """One bit of ``path`` flipped, ``at`` of the way in (0: the first byte, 1: the last)."""
    data = bytearray(path.read_bytes())
    data[min(int(at * len(data)), len(data) - 1)] ^= 0x10
    path.write_bytes(bytes(data))


PLACES = [0.0, 0.5, 1.0]


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """The embedded corpus's text and document starts, copied with their seals from this machine's cache (built
    there once if missing: parsing the stdlib costs seconds) into the module's own folder, and read back from it."""
    import shutil

    from harness.data import corpus

    corpus.Embedded().document_starts()  # this machine's cache: the text and the starts
    root = tmp_path_factory.mktemp("cache")
    for made in corpus.CACHE.glob("stdlib-prose-*"):
        shutil.copyfile(made, root / made.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus, "CACHE", root)
        whole = corpus.Embedded().load()
        starts = corpus.Embedded().document_starts()
    return root, whole.sha256, starts


@pytest.fixture
def cache(built_cache, tmp_path, monkeypatch):
    """A copy of the built cache that this test may damage."""
    import shutil

    from harness.data import corpus

    copy = tmp_path / "cache"
    shutil.copytree(built_cache[0], copy)
    monkeypatch.setattr(corpus, "CACHE", copy)
    return copy


@pytest.mark.parametrize("at", PLACES)
def test_the_embedded_corpus_cache_damaged_is_refused_before_a_run_reads_it(cache, at):
    from harness.data.corpus import Embedded

    text = next(cache.glob("stdlib-prose-*.txt"))
    flipped(text, at)
    for read in (Embedded().sizes, Embedded().load):  # sizes: the validation pass, before anything is built
        with pytest.raises(ConfigError, match=rf"{text.name} is damaged .*delete .* and the next run builds it"):
            read()


def test_an_embedded_corpus_cache_from_before_seals_is_built_again_sealed(cache, built_cache):
    from harness.data.corpus import Embedded

    text = next(cache.glob("stdlib-prose-*.txt"))
    integrity.seal_path(text).unlink()
    text.write_bytes(b"an old cache nobody can vouch for " * 100)
    assert Embedded().load().sha256 == built_cache[1] and integrity.check_file(text, "")  # as after the fix it names


@pytest.mark.parametrize("at", PLACES)
def test_the_document_starts_cache_damaged_is_refused(cache, built_cache, at):
    from harness.data.corpus import Embedded

    train, val = Embedded().document_starts()
    assert np.array_equal(train, built_cache[2][0]) and np.array_equal(val, built_cache[2][1])
    starts = next(cache.glob("*.starts.npy"))
    flipped(starts, at)
    with pytest.raises(ConfigError, match=rf"{starts.name} is damaged"):
        Embedded().document_starts()


@pytest.mark.parametrize("at", [0.3, 0.6, 0.9])
def test_a_tuned_best_json_changed_after_it_was_written_is_refused(tmp_path, at):
    from harness.config.load import tuned_values

    best = tmp_path / "best.json"
    integrity.write(best, {"cells": {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": 3.5e-4}}}})
    assert tuned_values(str(best), "rope", "softmax") == {"optim.optimizer.lr": 3.5e-4}
    text = best.read_text()
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    i = digits[int(at * (len(digits) - 1))]
    best.write_text(text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :])  # still JSON: only the seal knows
    with pytest.raises(ConfigError, match="changed after python -m results tune wrote it"):
        tuned_values(str(best), "rope", "softmax")


def test_a_best_json_from_before_seals_is_read_as_it_is(tmp_path):
    from harness.config.load import tuned_values

    best = tmp_path / "best.json"
    best.write_text(json.dumps({"cells": {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": 1e-3}}}}))
    assert tuned_values(str(best), "rope", "softmax") == {"optim.optimizer.lr": 1e-3}


@pytest.mark.parametrize("kind", ["run.json", "mlflow_sweep.json"])
def test_a_record_whose_seal_key_itself_was_damaged_is_not_taken_for_one_from_before_seals(tmp_path, kind):
    from harness.record.resume import RunLink
    from harness.sweep.callback import SweepRecord

    record = (
        RunLink("abc", "h", "sqlite:///x.db", "posbench")
        if kind == "run.json"
        else SweepRecord("abc", "s", "sqlite:///x.db", "posbench", ["pos"])
    )
    record.save(tmp_path)
    path = tmp_path / kind
    path.write_text(path.read_text().replace('"sha256"', '"sha257"').replace('"abc"', '"abd"'))
    with pytest.raises(ConfigError, match=rf"{kind} is damaged \(its seal's key reads 'sha257'\)"):
        type(record).load(tmp_path)


def _export(tmp_path: Path) -> Path:
    from harness.data.tokenizer import ByteTokenizer
    from tests.helpers import tiny_export

    return tiny_export(tmp_path / "hf_model", tokenizer=ByteTokenizer())  # ids are bytes


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
@pytest.mark.parametrize("at", PLACES)
def test_an_exported_model_changed_since_export_is_refused_by_hf_eval_before_loading(tmp_path, name, at):
    from harness.pretrained.hf_eval import parse

    folder = _export(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "config.json.sha256",
        "model.safetensors",
        "model.safetensors.sha256",
        "tokenizer.json",
        "tokenizer.json.sha256",
        "tokenizer_config.json",
        "tokenizer_config.json.sha256",
    ]
    argv = [
        str(folder),
        "--lengths",
        "16",
        "--budget",
        "64",
        "--check",
        "--tracking-uri",
        f"sqlite:///{tmp_path / 'm.db'}",
    ]
    parse(argv)  # whole: accepted
    flipped(folder / name, at)
    with pytest.raises(ConfigError, match=rf"{name} is damaged .*export the model again"):
        parse(argv)


def test_hf_rope_refuses_an_exported_config_changed_since_export(tmp_path):
    from harness.pretrained.rope_parameters import read_config

    folder = _export(tmp_path)
    read_config(folder)
    flipped(folder / "config.json", 0.5)
    with pytest.raises(ConfigError, match="config.json is damaged"):
        read_config(folder)


def test_theta_csv_changed_in_the_artifact_store_is_refused_by_the_report(store):
    from mlflow.tracking import MlflowClient

    from harness.record.run import TrackedRun
    from results.theta import _theta_rows

    uri = store  # a copy of the migrated empty store
    run = TrackedRun(uri, "posbench", "theta")
    with run.open({}, {}):
        run.log_files(integrity.sealed_files({"theta.csv": "i,theta0,theta_final,ratio\n0,1,1.5,1.5\n"}))
    client = MlflowClient(tracking_uri=uri)
    assert _theta_rows(client, run.run_id) == [{"i": 0.0, "theta0": 1.0, "theta_final": 1.5, "ratio": 1.5}]
    stored = next(Path(client.get_run(run.run_id).info.artifact_uri.removeprefix("file://")).rglob("theta.csv"))
    flipped(stored, 0.9)
    with pytest.raises(ConfigError, match="theta.csv is damaged"):
        _theta_rows(client, run.run_id)


def _report_folder(root: Path) -> Path:
    folder = root / "grid"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("# grid: rope vs t5\n\n**Verdict: inconclusive at toy scale**\n")
    (folder / "report.csv").write_text("pos,attn,final_val_loss\nrope,softmax,2.5\n")
    (folder / "plot.png").write_bytes(bytes(range(256)) * 8)
    integrity.seal_report(folder)
    return folder


def test_a_report_folders_seal_is_what_sha256sum_checks(tmp_path):
    """SHA256SUMS is coreutils' format: a reader who has no posbench checks a report with ``sha256sum -c``."""
    import shutil
    import subprocess

    folder = _report_folder(tmp_path)
    lines = (folder / integrity.SUMS).read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["README.md", "plot.png", "report.csv"]
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum on this machine")
    assert subprocess.run(["sha256sum", "--quiet", "-c", integrity.SUMS], cwd=folder).returncode == 0
    flipped(folder / "plot.png", 0.5)
    checked = subprocess.run(["sha256sum", "--quiet", "-c", integrity.SUMS], cwd=folder, capture_output=True)
    assert checked.returncode == 1


@pytest.mark.parametrize("at", PLACES)
@pytest.mark.parametrize("name", ["README.md", "report.csv", "plot.png", integrity.SUMS])
def test_results_index_refuses_a_report_folder_changed_after_it_was_sealed(tmp_path, capsys, name, at):
    """``results index`` reads each report's README into results/README.md: a folder sealed when its command wrote
    it is checked first, so a flipped byte anywhere in it (its SHA256SUMS too) is one line, exit 2, index unwritten."""
    from results.__main__ import main

    folder = _report_folder(tmp_path)
    assert main(["index", "--dir", str(tmp_path)]) == 0
    assert "inconclusive at toy scale" in (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").unlink()
    capsys.readouterr()
    flipped(folder / name, at)
    assert main(["index", "--dir", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    named = f"error: {folder / (name if name != integrity.SUMS else '')}".rstrip("/")
    assert "\n" not in line and line.startswith(named)
    assert "run the command its README names again, or restore the folder" in line
    assert not (tmp_path / "README.md").exists()


def test_a_report_folder_from_before_seals_is_indexed_and_a_readme_written_after_the_seal_is_refused(tmp_path, capsys):
    from results.__main__ import main

    folder = _report_folder(tmp_path)
    (folder / integrity.SUMS).unlink()  # a report from before seals: read as it is
    assert main(["index", "--dir", str(tmp_path)]) == 0
    integrity.seal_report(folder)
    lines = (folder / integrity.SUMS).read_text().splitlines()
    (folder / integrity.SUMS).write_text("\n".join(x for x in lines if not x.endswith("README.md")) + "\n")
    assert main(["index", "--dir", str(tmp_path)]) == 2
    assert "README.md is not in" in capsys.readouterr().err
    (folder / integrity.SUMS).write_text("not a sha256sum line\n")
    assert main(["index", "--dir", str(tmp_path)]) == 2
    assert "SHA256SUMS is damaged (line 1 is not a sha256sum line: 64 hex digits" in capsys.readouterr().err


def test_the_theta_section_lists_seeds_in_number_order(tmp_path, store):
    """Seed 2 before seed 10 in theta.csv's columns (a staged sweep goes up to 10 seeds)."""
    from mlflow.tracking import MlflowClient

    from harness.record.run import TrackedRun
    from results.cells import Cell
    from results.theta import theta_section

    uri, cells = store, []  # a copy of the migrated empty store
    for seed in ("10", "2"):
        run = TrackedRun(uri, "posbench", f"theta{seed}")
        with run.open({}, {}):
            run.log_files(integrity.sealed_files({"theta.csv": "i,theta0,theta_final,ratio\n0,1,1.5,1.5\n"}))
        cells.append(Cell(run.run_id, seed, seed, "rope_trainable", "softmax", seed, "finished"))
    theta_section(MlflowClient(tracking_uri=uri), cells, tmp_path)
    assert (tmp_path / "theta.csv").read_text().splitlines()[0] == "i,theta0,ratio_seed2,ratio_seed10"
