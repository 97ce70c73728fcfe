"""progress: the tests that start real processes (the rest: tests/unit/test_progress.py).

Progress output: a bar in a terminal, a few plain lines in a redirected log, nothing when disabled.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from tests.helpers import HANG, ROOT, TINY

LINE = re.compile(
    r"^(train|val)\s+step\s+(\d+)/12  loss (\d+\.\d{4})  val loss (—|\d+\.\d{4})  tokens/s ([\d,]+|—)"
    r"  elapsed \d+:\d\d:\d\d  ETA (\d+:\d\d:\d\d|—)$"
)


def test_a_redirected_run_prints_a_few_plain_lines(tmp_path, _empty_store):
    """A real run with stdout in a file (progress.mode=auto): a line per 4 steps and per validation, no '\\r',
    no Lightning banners."""
    log, db = tmp_path / "log", tmp_path / "mlflow.db"
    shutil.copyfile(_empty_store, db)  # a migrated store: creating one costs seconds
    overrides = [
        o
        for o in TINY
        if not o.startswith(("trainer.max_steps", "trainer.val_check_interval", "trainer.enable_progress_bar"))
    ]
    with log.open("w") as out:
        proc = subprocess.run(
            [
                sys.executable,
                "run.py",
                *overrides,
                "trainer.max_steps=12",
                "trainer.val_check_interval=6",
                "progress.every_n_steps=4",
                "checkpoint.every_n_steps=0",
                f"hydra.run.dir={tmp_path / 'out'}",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=HANG,
            env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    progress_lines = [m for m in map(LINE.match, lines) if m]
    # step 12 is a validation step: its val line replaces the train line
    assert [(m[1], int(m[2])) for m in progress_lines] == [("train", 4), ("val", 6), ("train", 8), ("val", 12)]
    assert [m[4] == "—" for m in progress_lines] == [True, False, False, False]  # no val loss before the first
    assert progress_lines[-1][6] == "0:00:00"
    final = next(line for line in lines if "final val loss" in line)
    assert progress_lines[-1][4] in final  # the last line's val loss is the summary's
    for banner in ("GPU available", "TPU available", "Tip:", "max_steps=12` reached"):
        assert banner not in text and banner not in proc.stderr
    assert len(lines) <= 14, text  # 4 progress lines + the summary
