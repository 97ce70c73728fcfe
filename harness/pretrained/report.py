"""``posbench hf-eval``'s report: perplexity, LongPPL and passkey accuracy by length per cell, the loss curves, and
the declared claim's verdict (each comparison with its interval, p-value and Holm decision) — the parent run's
``hf_eval.md``, ``hf_eval.csv`` and ``hf_eval_loss.png``, and with ``--out DIR`` the same files in DIR (README.md)."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from harness import markdown
from harness.errors import ConfigError
from harness.integrity import report_folder

# labels per block of the claim's t test: adjacent blocks hold consecutive text, and over blocks of one stride the
# per-block differences between two cells are autocorrelated (the test's p-values too small); over this many
# labels they are nearly independent (batch means)
BLOCK = 1024


def judge(spec, context: int, losses: dict[tuple[str, float], dict[int, torch.Tensor]]) -> list[dict]:
    """The claim's comparisons: per factor, per length beyond ``context``, each adjacent pair (a better than b) as a
    paired t test over blocks of max(``stride``, ``BLOCK``) consecutive labels; Holm over the family at
    ``spec.level``. One dict per comparison: factor, length, a, b, diff (mean loss a − b, nats), low, high (95 %), p,
    decision."""
    from harness.stats import holm, paired_interval, paired_p_value

    rows, cells = [], spec.cells()
    for factor in spec.factors:
        arms = [(m, factor) if (m, factor) in cells else (m, 1.0) for m in spec.claim]  # none, own, dca: at 1 only
        for length in (n for n in spec.lengths if n > context):
            block = max(spec.stride_at(length), BLOCK)
            means = {
                arm: [float(b.mean()) for b in losses[arm][length].split(block) if len(b) == block] for arm in arms
            }
            for a, b in zip(arms, arms[1:], strict=False):
                interval = paired_interval(means[a], means[b])
                p = paired_p_value(means[a], means[b])
                rows.append(
                    {
                        "factor": factor,
                        "length": length,
                        "a": a[0],
                        "b": b[0],
                        "blocks": len(means[a]),
                        "diff": interval[0]
                        if interval
                        else float(torch.tensor(means[a]).mean() - torch.tensor(means[b]).mean()),
                        "low": interval[1] if interval else float("nan"),
                        "high": interval[2] if interval else float("nan"),
                        "p": 1.0 if p is None else p,
                    }
                )
    for row, rejected in zip(rows, holm([r["p"] for r in rows], spec.level), strict=True):
        row["decision"] = (
            "inconclusive"
            if not rejected
            else f"negligible (below {spec.margin:g} nats)"
            if abs(row["diff"]) < spec.margin
            else "supports"
            if row["diff"] < 0
            else "contradicts"
        )
    return rows


def verdict(rows: list[dict]) -> str:
    if any(r["decision"] == "contradicts" for r in rows):
        return "contradicted"
    return "supported" if rows and all(r["decision"] == "supports" for r in rows) else "inconclusive"


def table(
    spec,
    results: dict[tuple[str, float], dict[str, float]],
    rows: list[dict] | None = None,
    keys: dict[int, torch.Tensor] | None = None,
    context: int | None = None,
) -> str:
    """The report: one row per cell (perplexity, LongPPL, passkey by length), then the claim's comparisons."""
    columns = [  # (heading, metric, format): "—" where a cell has no such metric
        (f"{said} at {x}", f"{metric}_at_{x}", form)
        for said, metric, form in (
            ("ppl", "val/ppl", ".3f"),
            ("LongPPL", "key/ppl", ".3f"),
            ("passkey", "passkey/acc", ".2f"),
        )
        for x in spec.lengths
    ]
    lines = _by_cell(columns, results)
    if keys is not None:
        own = (
            ""
            if spec.evaluator
            else (
                " With the model as its own evaluator the key tokens are those it predicts "
                "well unscaled (LCL > −2), so the `none` cell's LongPPL is low by "
                "construction: compare the scaled cells with each other, or give "
                "--evaluator a stronger model with the same tokenizer."
            )
        )
        lines += [
            "",
            "LongPPL's key tokens (LSD > 2 nats and LCL > −2 with the short context of "
            f"{spec.short} tokens, found by {spec.evaluator or 'the model as trained'}): "
            + (
                ", ".join(f"{int(m.sum())} of {len(m)} at {x}" for x, m in keys.items())
                or "none — no length exceeds the short context"
            )
            + "; — where none was found."
            + own,
        ]
    lines += _bounds("Passkey retrieval", {str(x): f"passkey/acc_at_{x}" for x in spec.lengths}, results)
    unfit = [str(n) for n in spec.lengths if not any(f"passkey/acc_at_{n}" in m for m in results.values())]
    if unfit and spec.passkey_trials:
        lines.append(
            f"\nNo passkey figure at {', '.join(unfit)} (— in its columns): the needle, question and answer do not fit "
            "in that many tokens, in any cell."
        )
    lines += _score_table("ruler/", "RULER-style tasks (RULER's share of the expected strings)", results)
    unfit = [
        f"{t} at {n}"
        for t in spec.tasks
        for n in spec.lengths
        if not any(f"ruler/{t}_at_{n}" in m for m in results.values())
    ]
    if unfit:
        lines.append(
            f"\nNo RULER-style figure for {', '.join(unfit)}: the task's prompt does not fit in that many tokens "
            "(its items, question and answer), in any cell."
        )
    lines += _score_table("lm_eval/", "lm-evaluation-harness", results)
    cost = {
        x: [
            m[f"cost/seconds_per_1k_tokens_at_{x}"]
            for m in results.values()
            if f"cost/seconds_per_1k_tokens_at_{x}" in m
        ]
        for x in spec.lengths
    }
    if all(cost.values()):
        lines += [
            "",
            "Cost on this device, wall seconds per 1,000 tokens forwarded (median over cells): "
            + ", ".join(f"{sorted(c)[len(c) // 2]:.3g} at {x}" for x, c in cost.items())
            + ".",
        ]
    if rows:
        lines += [
            "",
            f"## Claim: {' < '.join(spec.claim)} in loss beyond the trained context ({context} tokens)",
            "",
            f"**Verdict: {verdict(rows)}** — {len(rows)} comparisons, paired t tests over blocks of max(stride, "
            f"{BLOCK}) consecutive labels (the same tokens in both cells), Holm-corrected at family-wise "
            f"α = {spec.level:g}; a difference below {spec.margin:g} nats is negligible, for neither side. One "
            "text: a claim about this text and model, not about the scalings in general.",
            "",
            *markdown.table(
                ["factor", "length", "comparison", "Δ loss (nats)", "95 % interval", "p", "blocks", "decision"],
                [
                    [
                        f"{r['factor']:g}",
                        r["length"],
                        f"{r['a']} − {r['b']}",
                        f"{r['diff']:+.4f}",
                        f"{r['low']:+.4f} … {r['high']:+.4f}",
                        f"{r['p']:.2g}",
                        r["blocks"],
                        r["decision"],
                    ]
                    for r in rows
                ],
            ),
        ]
    return "\n".join(lines) + "\n"


def _by_cell(columns: list[tuple[str, str, str]], results: dict[tuple[str, float], dict[str, float]]) -> list[str]:
    """A markdown table with one row per cell (scaling, factor) and one column per (heading, metric, format): the
    report's and each score table's; "—" where a cell has no such metric."""
    return markdown.table(
        ["scaling", "factor", *(heading for heading, _, _ in columns)],
        [
            [method, f"{factor:g}", *(format(m[metric], form) if metric in m else "—" for _, metric, form in columns)]
            for (method, factor), m in results.items()
        ],
    )


def _bounds(what: str, names: dict[str, str], results: dict[tuple[str, float], dict[str, float]]) -> list[str]:
    """A floor or ceiling named (``names``: the metric by how the report says it): every cell 0 (or 1) on a score
    cannot tell the scalings apart there."""
    said = []
    for label, name in names.items():
        values = [m[name] for m in results.values() if name in m]
        if values and max(values) == 0:
            said.append(f"{label}: every cell 0 — a floor")
        elif values and min(values) == 1:
            said.append(f"{label}: every cell 1 — a ceiling")
    return [
        f"\n{what} cannot discriminate at " + "; ".join(said) + " (the model scores the same whatever the scaling)."
    ][: bool(said)]


def _score_table(prefix: str, title: str, results: dict[tuple[str, float], dict[str, float]]) -> list[str]:
    """The scores named ``prefix…`` per cell (``ruler/``: --tasks; ``lm_eval/``: --lm-eval), with their floors and
    ceilings."""
    names = sorted({k for m in results.values() for k in m if k.startswith(prefix)}, key=_by_length)
    said = {x: x[len(prefix) :].replace("_at_", " at ") for x in names}
    lines = ["", f"## {title}", "", *_by_cell([(said[x], x, ".3g") for x in names], results)]
    return (lines + _bounds(title, {v: k for k, v in said.items()}, results)) if names else []


def _by_length(name: str) -> tuple[str, int]:
    """``ruler/vt_at_512`` as (``ruler/vt``, 512): a task's lengths in order, 256 before 1024."""
    task, _, length = name.rpartition("_at_")
    return (task, int(length)) if length.isdigit() else (name, 0)


def csv(results: dict[tuple[str, float], dict[str, float]]) -> str:
    names = sorted({k for m in results.values() for k in m})
    out = ["scaling,factor," + ",".join(names)]
    out += [
        f"{method},{factor:g}," + ",".join(f"{m[k]:.6g}" if k in m else "" for k in names)
        for (method, factor), m in results.items()
    ]
    return "\n".join(out) + "\n"


def curves(spec, results: dict[tuple[str, float], dict[str, float]]) -> bytes:
    """Loss by context length, one line per cell (PNG)."""
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global figures

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for (method, factor), m in results.items():
        ax.plot(spec.lengths, [m[f"val/loss_at_{x}"] for x in spec.lengths], marker="o", label=f"{method} ×{factor:g}")
    ax.set(
        xscale="log",
        xlabel="context length L (tokens)",
        ylabel="loss (nats/token)",
        title=f"{spec.model.name}: sliding-window loss by length",
    )
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def files(
    spec, results, rows, keys, context, command: str, seconds: float, run_id: str | None
) -> dict[str, str | bytes]:
    """The report's files, the markdown opened by its title and how to regenerate it: ``command`` (none: not said),
    its wall time ``seconds`` and the parent run ``run_id``."""
    how = (
        f"after {spec.finetune_steps} fine-tuning steps at {spec.tune_length} tokens"
        if spec.finetune_steps
        else "zero-shot"
    )
    header = (
        f"# hf-eval: {spec.model.name}, {how}\n\n"
        + (f"Command: `{command}` " if command else "")
        + f"(wall time {seconds / 60:.1f} min; MLflow parent run `{run_id}`, experiment `{spec.experiment}`).\n\n"
    )
    return {
        "hf_eval.md": header + table(spec, results, rows, keys, context),
        "hf_eval.csv": csv(results),
        "hf_eval_loss.png": curves(spec, results),
    }


def write(out: Path, files: dict[str, str | bytes]) -> None:
    """The report's files in ``out`` (hf_eval.md as README.md), written whole or not at all, then sealed."""
    try:
        with report_folder(out) as staging:
            for name, content in files.items():
                target = staging / ("README.md" if name == "hf_eval.md" else name)
                target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write the report ({e.strerror or e}); give a writable folder") from None
