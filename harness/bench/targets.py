"""The benchmark's targets: each states a goal and how it is measured, and reports a 95 %
interval; the verdict is "met" only when the whole interval satisfies the goal (stats.Goal.judge).

Kinds of measurement:
  PairedTarget        a ratio of two cells' step times, by ABBA rounds until resolved (session.py)
  OverheadTarget      a scheme's own ops as a share of the step, profiled inside it (profiled.py), with the
                      end-to-end paired ratio beside it as a check
  MfuTarget           FLOPs / step time / the run's matmul peak, over timed steps
  MemoryPerTokenTarget peak allocated bytes per token, one length over another (deterministic: a point)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import torch

from harness.bench.cells import Peer, Spec
from harness.bench.measure import time_call
from harness.bench.profiled import Breakdown, breakdown, kernel_share, op_times, paired_op_times, positional_share
from harness.bench.session import Result, Session, paired_rounds
from harness.bench.stats import MIN_ROUNDS, Goal, Interval, Verdict


@dataclass
class Outcome:
    label: str
    goal: Goal
    cells: dict[str, Result]
    interval: Interval | None
    verdict: Verdict
    method: str  # how it was measured, for the report
    check: str = ""  # a second measure of the same quantity, or why there is no value
    where: Breakdown | None = None  # where the time goes, when the verdict is not "met" (CPU, paired targets)


@dataclass(frozen=True)
class Target:
    label: str
    goal: Goal
    cells: dict[str, Spec]
    budget_s: float = 18.0  # time for the rounds that narrow the interval (bounds the run's length)

    def evaluate(self, session: Session) -> Outcome:
        results = {k: session.cell(s, keep=True) for k, s in self.cells.items()}
        try:  # the kept steps are released however this ends
            failed = {k: r for k, r in results.items() if not r.ok}
            if failed:
                why = "; ".join(f"{k}: {r.status}: {r.reason[:80]}" for k, r in failed.items())
                return Outcome(self.label, self.goal, results, None, "not measured", "—", why)
            interval, method, check = self.measure(session, results)
            verdict = self.goal.judge(interval)
            where = self.explain(session) if verdict != "met" and session.options.device == "cpu" else None
        finally:
            session.release()
        return Outcome(self.label, self.goal, results, interval, verdict, method, check, where)

    def measure(self, session: Session, results: dict[str, Result]) -> tuple[Interval, str, str]:
        raise NotImplementedError

    def explain(self, session: Session) -> Breakdown | None:
        """Where the time goes when the goal is not met (the kept steps are still live)."""
        return None


@dataclass(frozen=True)
class PairedTarget(Target):
    num: str = ""  # the cells whose step times are divided
    den: str = ""

    def measure(self, session, results):
        steps = (session.step(self.cells[self.num]), session.step(self.cells[self.den]))
        ratio = paired_rounds(*steps, session.options.device, self.goal, budget_s=self.budget_s)
        return ratio, f"paired ABBA, {len(ratio.samples)} rounds", ""

    def explain(self, session):
        times = paired_op_times(session.step(self.cells[self.num]), session.step(self.cells[self.den]))
        return breakdown(*times, (self.num, self.den), self.goal.op, self.goal.value)


@dataclass(frozen=True)
class OverheadTarget(Target):
    """cells: "with" (the scheme) and "without" (pos=none at the same shape). CPU: the profiled share of
    the scheme's ops (an end-to-end round's noise hides a 2 % goal); CUDA: the paired ratio."""

    profiled_steps: int = 4
    check_s: float = 12.0  # the end-to-end check: a few rounds, it cannot resolve 2 % on a shared CPU

    def measure(self, session, results):
        device = session.options.device
        steps = (session.step(self.cells["with"]), session.step(self.cells["without"]))
        check = paired_rounds(*steps, device, None, budget_s=self.check_s).map(lambda r: r - 1)
        paired = f"paired end-to-end {_fmt(check, self.goal)} over {len(check.samples)} rounds"
        if device == "cuda":
            return check, f"paired ABBA, {len(check.samples)} rounds", ""
        shares = positional_share(session.model(self.cells["with"]).pos, steps[0], self.profiled_steps)
        return Interval.of_values([s.overhead for s in shares]), f"its ops profiled inside {len(shares)} steps", paired


@dataclass(frozen=True)
class MfuTarget(Target):
    """cells: "step". Rounds of one step and, right after it, the peak matmul (best of two n×n products at
    the run's peak size): MFU = step FLOP/s ÷ that matmul's FLOP/s, so load that comes and goes during the
    run moves both sides of a round alike (a peak timed once at the start can flatter or hide MFU several
    times over on a shared machine). ``MIN_ROUNDS`` rounds, more until resolved or the budget is spent."""

    def measure(self, session, results):
        r, o = results["step"], session.options
        step, n = session.step(self.cells["step"]), o.peak_n
        a = torch.randn(n, n, device=o.device, dtype=torch.bfloat16 if o.device == "cuda" else torch.float32)
        matmul = partial(torch.matmul, a, a)
        mfus: list[float] = []
        started = time.perf_counter()
        while len(mfus) < MIN_ROUNDS or (
            not self.goal.resolved(Interval.of_ratios(mfus)) and time.perf_counter() - started < self.budget_s
        ):
            seconds = time_call(step, o.device)
            peak = 2 * n**3 / min(time_call(matmul, o.device) for _ in range(2))
            mfus.append(r.flops / seconds / peak)
        return Interval.of_ratios(mfus), f"{len(mfus)} rounds of a step and the {n}² matmul peak", ""


@dataclass(frozen=True)
class MemoryPerTokenTarget(Target):
    """cells: "num", "den". Peak allocated bytes per token: deterministic for a given computation."""

    def measure(self, session, results):
        per_token = {k: r.peak_mem_mb / (r.batch * r.seq_len) for k, r in results.items()}
        total = results["num"].peak_mem_mb / results["den"].peak_mem_mb
        return (
            Interval.point(per_token["num"] / per_token["den"]),
            "peak allocated bytes (profiler) per token",
            f"total peak ratio {total:.2f}",
        )


def _fmt(interval: Interval, goal: Goal) -> str:
    return f"{goal.format(interval.estimate)} [{goal.format(interval.low)}, {goal.format(interval.high)}]"


def _per_len(attn: str, seq_len: int, **kw) -> Spec:
    """pos=none at batch 1: the length-scaling targets."""
    return Spec("none", attn, seq_len, 1, **kw)


def targets_for(device: str, tokens: int) -> list[Target]:
    """The targets on ``device`` (MFU: d512 at T=512 on CPU, T=2048 on CUDA)."""

    def wide(pos: str) -> Spec:  # d512 T=512, 8 rows at the default
        return Spec(pos, "softmax", 512, max(1, tokens // 1024), "d512")

    local = ("attn.window=256",)
    mfu = Spec("none", "softmax", 2048, max(1, tokens // 2048), "d512") if device == "cuda" else wide("none")
    goal_mfu = Goal(">=", 0.45 if device == "cuda" else 0.50, percent=True)
    return [
        OverheadTarget(
            "RoPE overhead vs pos=none (d512, T=512)",
            Goal("<=", 0.02, percent=True),
            {"with": wide("rope"), "without": wide("none")},
        ),
        MfuTarget(f"MFU of a training step (d512, T={mfu.seq_len}, none+softmax)", goal_mfu, {"step": mfu}),
        *[
            PairedTarget(
                f"{a}: step(16k) / step(1k), batch 1",
                Goal("<=", 20),
                {"16k": _per_len(a, 16384), "1k": _per_len(a, 1024)},
                num="16k",
                den="1k",
            )
            for a in ("performer", "linear")
        ],
        PairedTarget(
            "linear: causal / bidirectional step at 16k",
            Goal("<=", 2),
            {"causal": _per_len("linear", 16384, causal=True), "bi": _per_len("linear", 16384)},
            num="causal",
            den="bi",
        ),
        MemoryPerTokenTarget(
            "local (w=256): peak memory per token, 16k / 8k (linear memory: 1.0)",
            Goal("<=", 1.5),
            {
                "num": _per_len("local", 16384, attn_overrides=local),
                "den": _per_len("local", 8192, attn_overrides=local),
            },
        ),
        PairedTarget(
            "local (w=256) speed-up over full softmax at 16k",
            Goal(">=", 5),
            {"softmax": _per_len("softmax", 16384), "local": _per_len("local", 16384, attn_overrides=local)},
            num="softmax",
            den="local",
            budget_s=60.0,
        ),  # a round: two 16k steps
        PairedTarget(
            "T5 bias / plain softmax step (T=512)",
            Goal("<=", 1.3),
            {"t5": Spec("t5", "softmax", 512, tokens // 512), "none": Spec("none", "softmax", 512, tokens // 512)},
            num="t5",
            den="none",
        ),
        PairedTarget(
            "T5 bias on Performer / plain Performer (T=4096)",
            Goal("<=", 3),
            {
                "t5": Spec("t5", "performer", 4096, max(1, tokens // 4096)),
                "none": Spec("none", "performer", 4096, max(1, tokens // 4096)),
            },
            num="t5",
            den="none",
        ),
    ]


PEER_GOAL = Goal(">=", 1.2)  # posbench ÷ peer tokens/s at the same shape


@dataclass
class PeerOutcome:
    peer: Peer
    ours: Result
    theirs: Result
    interval: Interval | None  # posbench ÷ peer = peer step / posbench step
    verdict: Verdict
    why: str = ""  # why there is no interval
    kernel_share: float | None = None  # posbench's step time in matmul/attention kernels (CPU), see ceiling
    where: Breakdown | None = None  # peer's step ÷ posbench's, op by op, when not met (CPU)

    @property
    def ceiling(self) -> float | None:
        """posbench ÷ peer if every op of posbench's step other than its matmul and attention kernels were free."""
        if self.interval is None or not self.kernel_share:
            return None
        return self.interval.estimate / self.kernel_share


def compare_peer(session: Session, peer: Peer, spec: Spec, budget_s: float = 12.0) -> PeerOutcome:
    """The peer and posbench at one shape, then ABBA rounds of the two warm steps until resolved."""
    ours, theirs = session.cell(spec, keep=True), session.cell(spec, peer.name, peer.builder(), keep=True)
    try:  # the kept steps are released however this ends
        if not (ours.ok and theirs.ok):
            why = "; ".join(f"{r.name} {r.status}: {r.reason[:60]}" for r in (ours, theirs) if not r.ok)
            return PeerOutcome(peer, ours, theirs, None, "not measured", why)
        ratio = paired_rounds(
            session.step(spec, peer.name), session.step(spec), session.options.device, PEER_GOAL, budget_s=budget_s
        )
        verdict, share, where = PEER_GOAL.judge(ratio), None, None
        if session.options.device == "cpu":
            share = kernel_share(op_times(session.step(spec)))
            if verdict != "met":
                times = paired_op_times(session.step(spec, peer.name), session.step(spec))
                where = breakdown(*times, (peer.name, "posbench"), PEER_GOAL.op, PEER_GOAL.value)
    finally:
        session.release()
    return PeerOutcome(peer, ours, theirs, ratio, verdict, kernel_share=share, where=where)
