"""tools/damage_round.py as a test: one flipped bit at 16 places spread over each file posbench writes and reads back
(20 kinds: shards hashed whole and by block, manifests, vocabularies, caches, checkpoints, run links, sweep records,
best.json, exports, report folders, and the seals beside them), each read by the function its command calls; every try
must be refused in one line naming the file. The tool itself also flips every byte of the files under 4 KiB."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import ROOT


def test_every_flipped_bit_in_every_kind_of_file_posbench_writes_is_refused(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("damage_round", ROOT / "tools" / "damage_round.py")
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "damage_round", tool)  # its dataclass looks its module up
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool, "EVERY", 0)  # the 16 spread places only: ~15 s
    from harness.data import corpus

    monkeypatch.setattr(corpus, "CACHE", corpus.CACHE)  # the tool points it at its folders; put back after
    assert tool.main() == 0, capsys.readouterr().out
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("refused 320 (of 320 tries, 20 kinds)"), last
