"""``posbench <command>``: each subcommand does what its older form does (``python run.py --check`` …,
``python -m results …``, ``python -m harness.bench.…``), a bare word that is no command is one line naming the
nearest, and the older forms still work (the bad-input table and tests/process/test_install.py run them)."""

from __future__ import annotations

import sys

import pytest

from harness import main as posbench
from tests.helpers import TINY


def _run(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["posbench", *argv])
    try:
        code = posbench.main()
    except SystemExit as e:  # Hydra's app exits with the job's own status
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_help_names_every_command(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "help")
    assert code == 0
    assert all(f"posbench {name}" in out or f"|{name}" in out or f"{name}|" in out for name in posbench.COMMANDS)


@pytest.mark.parametrize(
    "command,older",
    [(["list", "--md"], ["--list=md"]), (["matrix"], ["--matrix"]), (["matrix", "--md"], ["--matrix=md"])],
)
def test_list_and_matrix_print_what_the_flags_print(command, older, monkeypatch, capsys):
    new = _run(monkeypatch, capsys, *command)
    assert new == _run(monkeypatch, capsys, *older) and new[0] == 0 and new[1]


def test_check_is_the_check_flag(monkeypatch, capsys, store):
    args = [*TINY, "pos=rope", f"logger.tracking_uri={store}"]
    code, out, err = _run(monkeypatch, capsys, "check", *args)
    assert (code, err) == (0, "") and out.startswith("ok: pos=rope attn=softmax")
    assert (code, out, err) == _run(monkeypatch, capsys, "--check", *args)
    code, out, err = _run(monkeypatch, capsys, "check", *args, "model.n_heads=3")
    assert code == 2 and out == "" and "not divisible by model.n_heads=3" in err and err.count("\n") == 1


def test_results_and_bench_commands_are_their_modules(monkeypatch, capsys, tmp_path):
    code, out, _ = _run(monkeypatch, capsys, "index", "--dir", str(tmp_path))
    assert code == 0 and (tmp_path / "README.md").exists()
    code, _, err = _run(monkeypatch, capsys, "bench", "loader", "--gb", "0")
    assert (
        code == 2
        and err == "error: argument --gb: 0 must be a positive number; see python -m harness.bench.loader --help\n"
    )
    code, _, err = _run(monkeypatch, capsys, "prepare", str(tmp_path / "out"), "--shard-tokens", "0")
    assert code == 2 and "--shard-tokens=0 must be a positive number of token ids" in err


def test_a_bare_word_is_no_override_and_names_the_nearest_command(monkeypatch, capsys):
    code, out, err = _run(monkeypatch, capsys, "chek", "pos=rope")
    assert code == 2 and out == ""
    assert err.startswith("error: 'chek' is no posbench command; did you mean check? (commands: run, check,")
