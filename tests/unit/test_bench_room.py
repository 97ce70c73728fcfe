"""The benchmark room's pieces: device-agnostic timing and memory (CUDA branches with a fake torch.cuda),
intervals and verdicts, adaptive paired rounds, the profiled positional share, where a comparison not met
loses its time, the CLI's bad input."""

import math
import statistics
import time
import types

import pytest
import torch

from harness.bench import cli, measure
from harness.bench.cells import Spec, build_posbench
from harness.bench.profiled import breakdown, kernel_share, op_times, positional_share
from harness.bench.session import Result, paired_rounds, prepare
from harness.bench.stats import MIN_ROUNDS, Goal, Interval, median_rank
from harness.bench.targets import MemoryPerTokenTarget, PeerOutcome
from harness.config.catalog import option_classes


class FakeCuda:
    """torch.cuda's timing and memory calls, recording their order; the step 'allocates' 500 bytes."""

    def __init__(self):
        self.calls, self.allocated, self.peak = [], 100, 100

    def Event(self, enable_timing):  # noqa: N802 — torch.cuda.Event
        cuda = self

        class Event:
            def record(self):
                cuda.calls.append("record")

            def synchronize(self):
                cuda.calls.append("event sync")

            def elapsed_time(self, end):
                return 250.0  # ms

        return Event()

    def synchronize(self):
        self.calls.append("sync")

    def reset_peak_memory_stats(self):
        self.calls.append("reset")
        self.peak = self.allocated

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.peak


def test_cuda_timing_reads_events_around_the_call():
    cuda, ran = FakeCuda(), []
    seconds = measure.time_call(lambda: ran.append(cuda.calls.copy()), "cuda", cuda=cuda)
    assert seconds == 0.25 and ran == [["record"]]  # the call runs between the two records
    assert cuda.calls == ["record", "record", "event sync"]


def test_cuda_memory_is_max_allocated_after_a_reset_minus_what_was_there():
    cuda = FakeCuda()

    def step():
        cuda.peak = cuda.allocated + 500

    assert measure.peak_allocated_bytes(step, "cuda", cuda=cuda) == 500
    assert cuda.calls == ["sync", "reset", "sync"]


def test_cpu_peak_allocated_bytes_counts_live_tensors_not_the_allocator():
    def step():
        a = torch.ones(2 * 2**20)  # 8 MiB
        b = torch.ones(2**20)  # 4 MiB while a is alive: peak 12 MiB
        del a, b
        torch.ones(2**20)  # 4 MiB after both were freed: no new peak

    peaks = [measure.peak_allocated_bytes(step, "cpu") for _ in range(2)]
    assert peaks[0] == peaks[1] and 12 * 2**20 <= peaks[0] < 12 * 2**20 + 4096  # deterministic, exact to a page


def test_cpu_timing_is_wall_time():
    assert 0.02 <= measure.time_call(lambda: time.sleep(0.02), "cpu") < 0.5


def test_interval_of_ratios_is_the_median_with_its_order_statistic_interval():
    ratios = [1.02, 0.99, 1.01, 2.4, 1.0, 1.03, 0.98, 1.6, 1.01]  # two rounds hit by a spike (one-sided noise)
    i = Interval.of_ratios(ratios)
    ordered = sorted(ratios)
    assert i.estimate == statistics.median(ratios) == 1.01  # the spikes do not move the estimate
    assert (i.low, i.high) == (ordered[1], ordered[7]) == (0.99, 1.6)  # n = 9: the 2nd and 8th of the sorted 9
    assert Interval.of_ratios([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]).low == 1.0  # n = 6: [min, max]
    with pytest.raises(ValueError, match="6 or more"):
        Interval.of_ratios([1.0] * 5)  # no 95 % interval of a median from 5 samples (1 − 2/2⁵ < 95 %)


@pytest.mark.parametrize("n", [2, 7, 31, 61])
def test_interval_of_values_is_the_mean_with_its_student_t_interval(n):
    """Mean ± t(0.975, n − 1)·s/√n, against scipy's t interval (n = 31, 61: beyond the normal's 1.96 by 4 % and 2 %)."""
    from scipy import stats

    values = [math.sin(i) + 0.1 * i for i in range(n)]
    low, high = stats.t.interval(0.95, n - 1, loc=statistics.fmean(values), scale=stats.sem(values))
    i = Interval.of_values(values)
    assert (i.low, i.estimate, i.high) == pytest.approx((low, (low + high) / 2, high), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 60))
def test_median_rank_is_the_largest_rank_with_95_percent_coverage(n):
    """Coverage of [x_(k), x_(n+1−k)] for the median of any continuous distribution: 1 − 2·P(Bin(n, ½) < k)."""

    def coverage(k):
        return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n

    k = median_rank(n)
    assert (k == 0) == (n < MIN_ROUNDS)
    if k:
        assert coverage(k) >= 0.95 > coverage(k + 1)
    else:
        assert coverage(1) < 0.95


@pytest.mark.parametrize(
    "low,high,at_most,at_least",
    [(0.5, 0.9, "met", "not met"), (1.1, 1.5, "not met", "met"), (0.9, 1.1, "unresolved", "unresolved")],
)
def test_a_goal_is_met_only_by_a_whole_interval(low, high, at_most, at_least):
    interval = Interval(math.sqrt(low * high), low, high)
    assert Goal("<=", 1.0).judge(interval) == at_most
    assert Goal(">=", 1.0).judge(interval) == at_least
    assert Goal("<=", 0.02, percent=True).judge(Interval.point(0.02)) == "met"


def test_paired_rounds_stop_once_resolved_and_give_up_at_the_round_budget(monkeypatch):
    """Scripted step times: a steady 2× ratio is resolved against ≤ 20 after the minimum 6 rounds; ratios
    alternating 1.0 / 1.2 straddle a goal of 1.1 however many rounds, so every allowed round is used (and
    never fewer than 6, whatever max_rounds says: fewer have no interval)."""
    from harness.bench import session

    times = {"num": iter([]), "den": iter([])}
    monkeypatch.setattr(session, "time_call", lambda step, device: next(times[step()]))
    times.update(num=iter([2.0] * 10), den=iter([1.0] * 10))
    clear = paired_rounds(lambda: "num", lambda: "den", "cpu", Goal("<=", 20), max_rounds=10)
    assert len(clear.samples) == MIN_ROUNDS == 6 and clear.estimate == pytest.approx(2.0)
    times.update(num=iter([1.0, 1.2] * 5), den=iter([1.0] * 10))
    straddling = paired_rounds(lambda: "num", lambda: "den", "cpu", Goal("<=", 1.1), max_rounds=8)
    assert straddling.samples == pytest.approx((1.0, 1.2) * 4)  # ABBA order, each side's own times
    assert Goal("<=", 1.1).judge(straddling) == "unresolved"
    times.update(num=iter([3.0] * 6), den=iter([1.0] * 6))
    assert len(paired_rounds(lambda: "num", lambda: "den", "cpu", None, max_rounds=2).samples) == 6


def test_positional_share_times_the_schemes_own_ops_and_restores_its_hooks():
    torch.manual_seed(0)
    rope = prepare(Spec("rope", "softmax", 64, 2), build_posbench, "cpu")
    none = prepare(Spec("none", "softmax", 64, 2), build_posbench, "cpu")
    rope.step(), none.step()
    shares = positional_share(rope.module.pos, rope.step, 2)
    assert all(0 < s.forward_s and 0 < s.backward_s and s.positional_s < s.step_s for s in shares)
    assert [s.backward_s for s in positional_share(none.module.pos, none.step, 1)] == [0.0]  # its hooks make no nodes
    assert not {"embed", "rotary", "logit_biases"} & set(vars(rope.module.pos))  # hooks are the class's again


def test_kernel_share_is_the_matmul_and_attention_share_of_the_ops_time():
    a, x = torch.randn(512, 512), torch.randn(1 << 18)
    matmul = op_times(lambda: a @ a @ a)  # aten::mm under aten::matmul's microseconds of dispatch
    # mostly kernel, not a figure: a busy machine's stall can land in the wrapper's self time (0.88 seen, not 0.99)
    assert max(matmul, key=matmul.__getitem__) == "aten::mm" and kernel_share(matmul) > 0.5
    assert kernel_share(op_times(lambda: x.exp().sin())) == 0.0
    mixed = kernel_share(op_times(lambda: (a @ a, x.exp().sin().cos())))
    assert 0.0 < mixed < 1.0
    assert kernel_share({"aten::mm": 3.0, "aten::gelu": 1.0}) == 0.75


def test_op_times_are_self_seconds_per_call():
    from torch.profiler import record_function

    def step():
        with record_function("nap"):
            time.sleep(0.2)
        torch.ones(8).exp()

    times = op_times(step, steps=3)
    assert 0.2 <= times["nap"] < 0.6  # per call of the step, not summed over the 3 calls (≥ 0.6 s however busy)
    assert times["aten::exp"] > 0 and "aten::mm" not in times


def test_breakdown_ranks_ops_by_difference_and_says_what_the_slow_side_must_lose():
    num = {"aten::bmm": 0.30, "aten::mm": 0.50, "aten::softmax": 0.05, "aten::add": 0.01}
    den = {"aten::mm": 0.50, "aten::_scaled_dot_product_flash_attention_for_cpu": 0.20, "aten::add": 0.02}
    b = breakdown(num, den, ("t5", "none"), "<=", 1.1, top=2)
    assert [(r.op, r.difference_s) for r in b.rows] == [
        ("aten::bmm", pytest.approx(0.30)),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", -0.20),
    ]
    assert (b.other.num_s, b.other.den_s) == (pytest.approx(0.56), pytest.approx(0.52))  # mm, softmax, add
    assert (b.num_s, b.den_s) == (pytest.approx(0.86), pytest.approx(0.72))
    assert b.side == "t5" and b.cut_s == pytest.approx(0.86 - 1.1 * 0.72)
    # at least: the denominator must get faster (peer ÷ posbench ≥ 1.2)
    peer = breakdown({"op": 1.08}, {"op": 1.0}, ("HF BERT", "posbench"), ">=", 1.2)
    assert peer.side == "posbench" and peer.cut_s == pytest.approx(1.0 - 1.08 / 1.2)
    assert breakdown({"op": 1.3}, {"op": 1.0}, ("a", "b"), ">=", 1.2).cut_s == 0.0  # met at these times


def test_a_paired_target_not_met_is_profiled_op_by_op_and_reported(monkeypatch):
    """A goal the measured ratio misses (T5 ÷ none ≤ 0.5; the ratio's interval given, so the verdict does not
    depend on the machine's load: test_a_goal_is_met_only_by_a_whole_interval judges intervals): the verdict is not
    met, the breakdown ranks the two live steps' ops by difference, and the report shows it (kernels marked)."""
    from harness.bench import targets
    from harness.bench.profiled import KERNEL_OPS
    from harness.bench.report import _where
    from harness.bench.session import Options, Session
    from harness.bench.targets import PairedTarget

    monkeypatch.setattr(targets, "paired_rounds", lambda *a, **k: Interval(1.5, 1.2, 1.8, (1.5,)))
    torch.manual_seed(0)
    session = Session(Options("cpu", 1e9, 64, repeats=1))
    target = PairedTarget(
        "T5 ÷ none",
        Goal("<=", 0.5),
        {"t5": Spec("t5", "softmax", 64, 2), "none": Spec("none", "softmax", 64, 2)},
        budget_s=0.0,
        num="t5",
        den="none",
    )
    outcome = target.evaluate(session)
    assert outcome.verdict == "not met" and outcome.where is not None and not session._live  # released after
    b = outcome.where
    differences = [abs(r.difference_s) for r in b.rows]
    assert len(b.rows) == 8 and differences == sorted(differences, reverse=True)
    assert b.side == "t5" and b.cut_s == pytest.approx(b.num_s - 0.5 * b.den_s) and b.cut_s > 0
    assert any(r.op == "aten::mm" for r in b.rows) or b.other.num_s > 0
    report = types.SimpleNamespace(peers=[], targets=[outcome])
    lines = _where(report)
    assert "### T5 ÷ none: not met" in lines and "| op | kind | t5 (ms) | none (ms) | difference (ms) |" in lines
    assert any(line.startswith("Profiled, t5 ÷ none = ") and "the t5 step must lose" in line for line in lines)
    rows = [line.split(" | ") for line in lines if line.startswith("| `")]
    assert len(rows) == 8 and all((kind == "kernel") == (op.strip("|` ") in KERNEL_OPS) for op, kind, *_ in rows)
    assert lines[-1].startswith("| **step** | — | ")
    met = PairedTarget(
        "none ÷ none",
        Goal("<=", 100),
        {"a": Spec("none", "softmax", 64, 2), "b": Spec("none", "softmax", 64, 1)},
        budget_s=0.0,
        num="a",
        den="b",
    ).evaluate(session)
    assert met.verdict == "met" and met.where is None
    assert _where(types.SimpleNamespace(peers=[], targets=[met])) == []


def test_peers_table_gives_the_ceiling_no_fusion_could_pass():
    """Ceiling = posbench ÷ peer over the kernels' share: 1.05 at 84 % kernels is at most 1.25."""
    from harness.bench.cells import PEERS
    from harness.bench.report import _peers

    bert = next(p for p in PEERS if p.name == "HF BERT")
    ours, theirs = (
        Result(n, "learned", "softmax", 512, 16, tokens_per_s=t, flops=7.1e10)
        for n, t in (("posbench", 10_500), ("HF BERT", 10_000))
    )
    outcome = PeerOutcome(bert, ours, theirs, Interval(1.05, 0.95, 1.16, (1.0, 1.1)), "unresolved", kernel_share=0.84)
    assert outcome.ceiling == pytest.approx(1.25)
    row = next(line for line in _peers([outcome]) if line.startswith("| HF BERT"))
    assert row.endswith("| 1.25 (84% kernels) |")
    no_share = PeerOutcome(bert, ours, theirs, outcome.interval, "unresolved")  # a CUDA run: not profiled
    assert next(line for line in _peers([no_share]) if line.startswith("| HF BERT")).endswith("| — |")


def test_a_peer_not_met_says_how_much_posbench_must_lose():
    from harness.bench.cells import PEERS
    from harness.bench.report import _where

    bert = next(p for p in PEERS if p.name == "HF BERT")
    ours, theirs = (Result(n, "learned", "softmax", 512, 16) for n in ("posbench", "HF BERT"))
    where = breakdown(
        {"aten::mm": 0.20, "aten::gelu_backward": 0.040},
        {"aten::mm": 0.21, "aten::gelu_backward": 0.01},
        ("HF BERT", "posbench"),
        ">=",
        1.2,
    )
    lines = _where(
        types.SimpleNamespace(
            peers=[PeerOutcome(bert, ours, theirs, Interval(1.0, 0.9, 1.1, (1.0,)), "not met", where=where)], targets=[]
        )
    )
    assert "### posbench ÷ HF BERT: not met" in lines
    assert "Profiled, HF BERT ÷ posbench = 1.09; for ≥ 1.2 the posbench step must lose 20.0 ms of 220.0 (9%)." in lines
    assert "| `aten::gelu_backward` | other | 40.0 | 10.0 | +30.0 |" in lines
    assert "| `aten::mm` | kernel | 200.0 | 210.0 | -10.0 |" in lines
    met_here = breakdown({"op": 1.3}, {"op": 1.0}, ("HF BERT", "posbench"), ">=", 1.2)
    lines = _where(
        types.SimpleNamespace(
            peers=[PeerOutcome(bert, ours, theirs, Interval(1.0, 0.9, 1.1, (1.0,)), "unresolved", where=met_here)],
            targets=[],
        )
    )
    assert any("within ≥ 1.2 at these times" in line for line in lines)


def test_local_attention_memory_per_token_does_not_grow_with_length():
    """The O(T·w) band allocates nothing that grows faster than T (peak allocated bytes of
    forward + backward, per token, at 2T over T)."""
    from attention.local import banded_attention

    def per_token(t: int) -> float:
        q, k, v = (torch.randn(1, 2, t, 16, requires_grad=True) for _ in range(3))
        step = lambda: banded_attention(q, k, v, 32, 32, 64).sum().backward()  # noqa: E731
        return measure.peak_allocated_bytes(step, "cpu") / t

    assert per_token(4096) / per_token(2048) <= 1.05


def test_memory_per_token_target_is_a_point_from_the_cells():
    cells = {
        "num": Result("posbench", "none", "local", 16384, 1, peak_mem_mb=300.0),
        "den": Result("posbench", "none", "local", 8192, 1, peak_mem_mb=160.0),
    }
    target = MemoryPerTokenTarget("mem", Goal("<=", 1.5), {})
    interval, method, check = target.measure(None, cells)
    assert interval == Interval.point(300 / 16384 / (160 / 8192)) and "total peak ratio 1.88" in check


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--pos", "rope,nope"], f"--pos nope: not in conf/pos/; valid: {', '.join(option_classes('pos'))}"),
        (["--attn", "flash"], f"--attn flash: not in conf/attn/; valid: {', '.join(option_classes('attn'))}"),
        (["--pos", "rope×3+nope"], "--pos rope×3+nope: not in conf/pos/; valid: "),  # a pattern by its name
        (["--attn", "local×0+softmax"], "'local×0+softmax' is no pattern name: write option names joined by +"),
        (["--lengths", "512,abc"], "--lengths '512,abc': use a comma list of positive integers"),
        (["--lengths", "0"], "every length must be positive"),
        (["--tokens", "0"], "argument --tokens: 0 must be a positive integer"),
        (["--tokens", "many"], "argument --tokens: 'many' is not an integer"),
        (["--cell-s", "-1"], "argument --cell-s: -1 must be a positive number"),
        (["--cell-s", "1e300"], "argument --cell-s: 1e300 must be at most 86,400"),  # no run is that long
        (["--budget-s", "1e300"], "argument --budget-s: 1e300 must be at most 86,400"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(args, needle, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and not out.exists()


def test_cuda_without_a_device_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--device", "cuda", "--out", str(tmp_path / "r")]) == 2
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_nothing_measured_writes_no_report(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "matmul_peak_flops", lambda device, sizes: measure.Peak(1e9, 64))
    out = tmp_path / "report"
    code = cli.main(
        [
            "--pos",
            "xl",
            "--attn",
            "local",
            "--lengths",
            "32",
            "--tokens",
            "64",
            "--no-peers",
            "--no-targets",
            "--out",
            str(out),
        ]
    )
    assert code == 2 and not out.exists()
    assert "nothing was measured" in capsys.readouterr().err


def test_mfu_target_divides_each_steps_flop_rate_by_the_matmul_rate_timed_right_after_it(monkeypatch):
    """Scripted times: a 1 s step of 5e8 FLOPs against a 64² matmul at 1e9 FLOP/s is 50 % MFU in every
    round, so the interval is that point and the minimum 6 rounds resolve it."""
    from harness.bench import targets

    calls = []

    def fake_time(fn, device):
        calls.append("step" if fn == "step" else "matmul")
        return 1.0 if fn == "step" else 2 * 64**3 / 1e9

    monkeypatch.setattr(targets, "time_call", fake_time)
    session = types.SimpleNamespace(options=types.SimpleNamespace(device="cpu", peak_n=64), step=lambda spec: "step")
    cells = {"step": Result("posbench", "none", "softmax", 512, 8, flops=5e8)}
    target = targets.MfuTarget("mfu", Goal(">=", 0.45, percent=True), {"step": None})
    interval, method, _ = target.measure(session, cells)
    assert interval.estimate == pytest.approx(0.5) and interval.low == pytest.approx(0.5)
    assert calls == ["step", "matmul", "matmul"] * MIN_ROUNDS and "64² matmul" in method
