"""report: the tests that train end to end (the rest: tests/unit/test_report.py).

The comparison report: its numbers on synthetic cells and a synthetic store, and its CLI.
"""

from tests.helpers import assert_figure


def test_offline_report_reproduces_the_sweeps_own(tiny_sweep, tmp_path):
    from results.__main__ import main

    out = tmp_path / "rep"
    assert main(["report", "--experiment", "posbench", "--out", str(out), "--tracking-uri", tiny_sweep.uri]) == 0
    logged = tiny_sweep.client.download_artifacts(tiny_sweep.parent.info.run_id, "report.md", str(tmp_path))
    assert (out / "report.md").read_text() == open(logged).read()
    assert_figure(out / "val_loss_vs_length.png")
