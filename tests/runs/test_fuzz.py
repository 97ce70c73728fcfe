"""tools/fuzz.py's fast slice in the suite: generated hostile values (a 64-bit overflow for every key of every
config option under ``check``, true for every switch that is off, "nan" for every typed flag of every command's
parser) each end in one line or are accepted, never a traceback, a usage block or a hang; one flipped bit at 16
places of each kind of file posbench writes and reads back (shards hashed whole and by block, manifests,
vocabularies, caches, checkpoints, run links, sweep records, best.json, exports, report folders, and the seals
beside them) is refused in one line naming the file. The whole round (every value, every byte of small files) is
``python tools/fuzz.py``."""

from __future__ import annotations

import re
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import fuzz  # noqa: E402


@pytest.mark.parametrize("table, least", [("values", 100), ("damage", 300)])
def test_every_generated_try_ends_as_allowed(table, least, capsys, monkeypatch):
    from harness.data import corpus

    monkeypatch.setattr(corpus, "CACHE", corpus.CACHE)  # the damage table points it at its folders
    code = fuzz.main(["--fast", "--table", table])
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert code == 0 and last.endswith("tries; 0 not as allowed)"), out[-3000:]
    tries = int(re.search(r"\(of (\d+) tries", last).group(1))
    assert tries >= least  # generated from what the commands and the writers declare, not listed by hand
    if table == "damage":
        assert last.startswith(f"one line {tries} ")  # damage is never accepted
