"""python -m harness.bench.loader: every flag checked before anything is written (one line, exit 2), the shard
sized as asked and said so, and deleted after."""

from __future__ import annotations

import pytest

from harness.bench import loader


def _refused(argv: list[str], capsys) -> str:
    assert loader.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


BAD = [
    (["--gb", "0"], "--gb: 0 must be a positive number"),
    (["--gb", "-1"], "must be a positive number"),
    (["--gb", "nan"], "must be a finite number"),
    (["--gb", "abc"], "'abc' is not a number"),
    (["--gb", "1e-9"], "holds less than one batch of the largest preset"),
    (["--gb", "1e9"], "GB free; give --gb"),
    (["--workers", "1000000"], "give a comma list of worker counts from 0 to"),
    (["--workers", "-1"], "give a comma list of worker counts"),
    (["--workers", "two"], "give a comma list of worker counts"),
    (["--workers", ""], "give a comma list of worker counts"),
    (["--presets", "nope"], "--presets nope: no paper scale"),
    (["--presets", ","], "no paper scale"),
    (["--batches", "0"], "must be a positive integer"),
    (["--repeats", "1.5"], "is not an integer"),
    (["--mfu", "0"], "must be a number in (0, 1]"),
    (["--mfu", "2"], "must be a number in (0, 1]"),
    (["--tflops", "-5"], "must be a positive number"),
    (["--vocab", "0"], "must be a positive integer"),
    (["--dir", "/nonexistent/deeper"], "not a folder this user can write"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_a_bad_flag_is_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args = argv if "--dir" in argv else [*argv, "--dir", str(scratch)]
    assert words in _refused(args, capsys)
    assert not list(scratch.iterdir())


def test_a_file_is_no_dir_and_a_folder_no_json(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert "not a folder this user can write" in _refused(["--dir", str(a_file)], capsys)
    assert "give a file path in a writable folder" in _refused(
        ["--dir", str(tmp_path), "--json", str(tmp_path)], capsys
    )


def test_a_small_run_says_its_size_and_deletes_its_shard(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert (
        loader.main(
            [
                "--presets",
                "grid",
                "--gb",
                "0.001",
                "--batches",
                "2",
                "--repeats",
                "1",
                "--dir",
                str(tmp_path),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("0.001 GB shard (1,000,000 bytes): written in")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]  # the shard folder is gone
    assert out.read_text().count('"preset": "grid"') == 4  # mlm/clm × random/sequential


def test_a_prepared_folder_is_timed_as_it_is_and_left_in_place(tmp_path, capsys):
    """--shards DIR: the folder prepare wrote from the embedded corpus (real ids) is timed, not written or
    deleted; the model's FLOPs take its vocabulary (258 bytes) unless --vocab says otherwise."""
    import json

    from harness.main import prepare_shards as prepare

    shards = tmp_path / "shards"
    manifest = prepare(shards, ["data=embedded"])
    size = sum(f.stat().st_size for f in shards.glob("train-*.bin"))
    assert size == 2 * manifest["splits"]["train"]["tokens"]
    before = sorted(p.name for p in shards.iterdir())
    out = tmp_path / "figures.json"
    assert (
        loader.main(
            ["--shards", str(shards), "--presets", "grid", "--batches", "2", "--repeats", "1", "--json", str(out)]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith(f"shards at {shards} ({size:,} bytes of training ids, vocabulary 258)")
    assert sorted(p.name for p in shards.iterdir()) == before
    figures = json.loads(out.read_text())
    assert figures["vocab"] == 258 and figures["shards"] == str(shards) and len(figures["rows"]) == 4
    assert (
        loader.main(
            [
                "--shards",
                str(shards),
                "--presets",
                "grid",
                "--batches",
                "2",
                "--repeats",
                "1",
                "--vocab",
                "50257",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["vocab"] == 50257


def test_a_bad_shard_folder_is_one_line(tmp_path, capsys):
    from harness.bench.internals import write_random_shards

    assert "--shards /nonexistent: data.path=/nonexistent has no manifest.json" in _refused(
        ["--shards", "/nonexistent"], capsys
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    write_random_shards(shards, 1000)
    assert "less than one batch of the largest preset" in _refused(["--shards", str(shards)], capsys)
    assert "give one of them" in _refused(["--shards", str(shards), "--gb", "1"], capsys)


def test_the_timed_start_up_imports_nothing(tmp_path):
    """startup_seconds times the source's checks and the first batch, not imports: a run has imported its
    modules before it reads the shards (a fresh interpreter, as ``python -m harness.bench.loader --shards``)."""
    import subprocess
    import sys

    from harness.bench.internals import write_random_shards
    from tests.helpers import ROOT

    write_random_shards(tmp_path, 100_000)
    code = (
        "import sys; from pathlib import Path; from harness.bench.loader import paper_shapes, startup_seconds; "
        f"shapes = paper_shapes('grid'); before = set(sys.modules); startup_seconds(Path({str(tmp_path)!r}), shapes); "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('harness', 'positional', 'attention'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"
