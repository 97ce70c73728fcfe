"""A slice of tools/generated_round.py in the suite: hostile values generated from what the commands declare — a
64-bit overflow for every key of every option of the config groups (under ``check``), "nan" for every typed flag of
every command's parser — each ends in one line or is accepted: never a traceback, a usage block or a hang. The
whole round (nine to eleven values each, 1,892 tries) is the tool's; this slice holds its property in CI."""

from __future__ import annotations

import sys

import pytest

from tests import inprocess
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import generated_round as rnd  # noqa: E402


def _tries() -> list[tuple[str, list[str]]]:
    flags = [t for t in rnd.flag_tries() if t[0].endswith("='nan'") and rnd.is_typed(t[0])]
    config = [t for t in rnd.config_tries() if t[0].endswith("=99999999999999999999")]
    return flags + config


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return rnd.inputs(tmp_path_factory.mktemp("round"))


def test_every_generated_try_is_one_line_or_accepted(work, tmp_path):
    bad = []
    tries = _tries()
    assert len(tries) > 100  # every option's keys and every command's typed flags: generated, not listed
    for i, (label, argv) in enumerate(tries):
        folder = tmp_path / f"try{i}"
        folder.mkdir()
        reply = rnd.attempt(inprocess, argv, folder, work, timeout=30)
        kind = rnd.classify(reply)
        if kind not in ("one line", "accepted"):
            bad.append(f"{kind}: {label}: {reply['stderr'].strip()[-300:]}")
    assert not bad, "\n".join(bad)
