"""bench_room: the tests that train end to end (the rest: tests/unit/test_bench_room.py).

The benchmark room's pieces: device-agnostic timing and memory (CUDA branches with a fake torch.cuda),
intervals and verdicts, adaptive paired rounds, the profiled positional share, where a comparison not met
loses its time, the CLI's bad input.
"""

from harness.bench import cli, measure


def test_a_failing_cell_is_a_failed_run_and_exit_1(monkeypatch, tmp_path, store):
    from mlflow.tracking import MlflowClient

    from harness.bench import cells

    real = cells.build_transformer

    def build(overrides, *rest):
        if "pos=rope" in overrides:
            raise RuntimeError("kernel exploded")
        return real(overrides, *rest)

    monkeypatch.setattr(cells, "build_transformer", build)
    monkeypatch.setattr(cli, "matmul_peak_flops", lambda device, sizes: measure.Peak(1e9, 64))
    code = cli.main(
        [
            "--pos",
            "none,rope",
            "--attn",
            "softmax",
            "--lengths",
            "32",
            "--tokens",
            "64",
            "--repeats",
            "1",
            "--no-peers",
            "--no-targets",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1 and "error: RuntimeError: kernel exploded" in (tmp_path / "README.md").read_text()
    client = MlflowClient(store)
    runs = {r.data.tags["pos"]: r for r in client.search_runs([client.get_experiment_by_name("bench").experiment_id])}
    assert runs["none"].info.status == "FINISHED" and runs["rope"].info.status == "FAILED"
    tags = runs["rope"].data.tags
    assert tags["failure"] == "error" and "kernel exploded" in tags["failure_reason"]
