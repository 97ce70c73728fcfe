"""The trainable-θ section of a paper report: how far RoPE's frequencies moved (Su's claim).

From each finished ``pos=rope_trainable`` run of a sweep:
  theta_drift.png   pos/theta_rel_change = ‖θ − θ₀‖/‖θ₀‖ and max_i |log θ_i/θ₀_i| against the
                    optimizer step (the scheme's diagnostics, logged every log_every_n_steps)
  theta_ratio.png   θ_final/θ₀ per frequency, against θ₀ (log-log; one line per seed), from the
                    run's ``theta.csv`` artifact; |ratio| is drawn, sign flips are marked
  theta.csv         the per-frequency table of every seed, side by side
Returns the README lines that embed them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from harness.errors import ConfigError
from harness.markdown import csv_text, table

# the drift metrics the scheme logs, each with its plot's y label
DRIFT_METRICS = {"pos/theta_rel_change": "‖θ − θ₀‖ / ‖θ₀‖", "pos/theta_max_log_ratio": "max_i |log θ_i / θ₀_i|"}


def _theta_rows(client, run_id: str) -> list[dict[str, float]]:
    from results.store import artifact_text

    fix = f"train run {run_id} again (its artifacts are not what it logged)"
    text = artifact_text(client, run_id, "theta.csv")  # sealed when logged (harness/train.py)
    if text is None:
        raise ConfigError(f"run {run_id} logged no theta.csv; {fix}")
    try:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"theta.csv of run {run_id} is damaged ({type(e).__name__}: {e}); {fix}") from None


def theta_section(client, cells, out: Path) -> list[str]:
    from results.plots import plt, save

    runs = sorted(
        (c for c in cells if c.pos == "rope_trainable" and c.status == "finished"), key=lambda c: int(c.seed)
    )  # seed 2 before 10
    if not runs:
        return ["## θ drift", "", "No finished `pos=rope_trainable` run in this sweep."]
    tables = {c.seed: _theta_rows(client, c.run_id) for c in runs}

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, (metric, ylabel) in zip(axes, DRIFT_METRICS.items(), strict=True):
        for c in runs:
            pts = sorted((m.step, m.value) for m in client.get_metric_history(c.run_id, metric))
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=f"seed {c.seed}")
        ax.set(xlabel="optimizer step", ylabel=ylabel)
        ax.set_title(metric.split("/", 1)[1], fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("trainable RoPE: drift of θ during training", fontsize=10)
    fig.tight_layout()
    save(fig, out / "theta_drift.png", dpi=120)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for seed, rows in tables.items():
        theta0 = [r["theta0"] for r in rows]
        ratio = [abs(r["ratio"]) for r in rows]
        (line,) = ax.plot(theta0, ratio, marker="o", ms=3, label=f"seed {seed}")
        flips = [(t, q) for t, q, r in zip(theta0, ratio, rows, strict=True) if r["ratio"] <= 0]
        if flips:
            xs, ys = zip(*flips, strict=True)
            ax.scatter(xs, ys, marker="x", s=60, color=line.get_color(), zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="θ₀ = base^(−2i/d)  (frequency at initialisation)",
        ylabel="|θ_final / θ₀|   (× = sign flipped)",
    )
    ax.set_title("trainable RoPE: final θ relative to its initialisation, per frequency", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out / "theta_ratio.png", dpi=120)

    seeds = list(tables)
    (out / "theta.csv").write_text(
        csv_text(
            ["i", "theta0", *[f"ratio_seed{s}" for s in seeds]],
            (
                [i, f"{row['theta0']:.10g}", *[f"{tables[s][i]['ratio']:.6g}" for s in seeds]]
                for i, row in enumerate(tables[seeds[0]])
            ),
        ),
        newline="",
    )

    finals = {c.run_id: client.get_run(c.run_id).data.metrics for c in runs}
    body = [
        [
            c.seed,
            f"{finals[c.run_id].get('pos/theta_rel_change', float('nan')):.4f}",
            f"{sum(abs(r['ratio'] - 1) > 0.1 for r in tables[c.seed])} of {len(tables[c.seed])}",
            f"{finals[c.run_id].get('pos/theta_max_log_ratio', float('nan')):.3f}",
            sum(r["ratio"] <= 0 for r in tables[c.seed]),
        ]
        for c in runs
    ]
    return [
        "## θ drift",
        "",
        "Per seed, at the end of training: how far θ moved as a whole (the norm, dominated by θ₀ = 1) and "
        "per frequency (θ_final/θ₀, from each run's `theta.csv` artifact; all frequencies in `theta.csv` here).",
        "",
        *table(
            ["seed", "‖θ−θ₀‖/‖θ₀‖", "frequencies moved > 10 %", "max over i of abs(log θ_i/θ₀_i)", "sign flips"],
            body,
            "lrrrr",
        ),
        "",
        "![theta_drift](theta_drift.png)",
        "![theta_ratio](theta_ratio.png)",
    ]
