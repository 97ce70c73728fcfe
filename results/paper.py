"""Paper-claim reports: ``python -m results paper --preset NAME [--scale toy] [--sweep ID]``.

Reads the preset's claim (conf/experiment/<preset>.yaml ``claim``) and its latest sweep from
MLflow, writes the comparison report (report.md, report.csv, plots) plus README.md with the
claim, the command, the environment, each comparison's difference with a 95 % confidence
interval, and a one-sentence verdict; then refreshes the index results/README.md.

Statistics: arms are compared on the per-seed final value of a metric; Δ = mean(lower) −
mean(than) with Welch's t interval (unequal variances). A comparison *supports* the claim when
the whole interval lies on the claimed side of 0, *contradicts* it when it lies on the other
side, and is *inconclusive* otherwise (always so with fewer than 2 seeds per arm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from results.stats import welch_interval

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    text: str  # one line for the table
    verdict: str  # supports | contradicts | inconclusive


def compare(comparison: dict, values: dict[str, list[float]]) -> Outcome:
    """One claim comparison: ``{metric, lower, than}`` or ``{metric, below, cell}``.

    A claim's ``comparisons`` decide its verdict; its optional ``also`` list holds secondary
    comparisons (e.g. a second paper's claim on the same runs) that are reported beside it."""
    metric = comparison["metric"]
    if "below" in comparison:
        xs, limit = values[comparison["cell"]], comparison["below"]
        shown = ", ".join(f"{x:.4g}" for x in xs) or "no finished run"
        verdict = ("supports" if xs and max(xs) < limit else
                   "contradicts" if xs and min(xs) >= limit else "inconclusive")
        return Outcome(f"{metric} of {comparison['cell']} < {limit}: per seed {shown}", verdict)
    lower, than = values[comparison["lower"]], values[comparison["than"]]
    ci = welch_interval(lower, than)
    head = f"{metric}: {comparison['lower']} − {comparison['than']}"
    if ci is None:
        return Outcome(f"{head}: n = {len(lower)} vs {len(than)}, too few seeds for an interval", "inconclusive")
    diff, low, high = ci
    verdict = "supports" if high < 0 else "contradicts" if low > 0 else "inconclusive"
    return Outcome(f"{head} = {diff:+.4f} (95 % CI {low:+.4f} … {high:+.4f}; n = {len(lower)} vs {len(than)})",
                   verdict)


def overall(outcomes: list[Outcome]) -> str:
    if not outcomes:
        return "no claim to test"
    if any(o.verdict == "contradicts" for o in outcomes):
        return "not reproduced"
    return "reproduced" if all(o.verdict == "supports" for o in outcomes) else "inconclusive"


def arm_values(client, cells, comparisons: list[dict]) -> dict[str, list[float]]:
    """Per arm (an override such as ``pos=rope``), the metric's final value of each finished seed.
    Comparisons that share an arm must share a metric (the report passes one comparison at a time)."""
    values: dict[str, list[float]] = {}
    for comparison in comparisons:
        for arm in (comparison.get(k) for k in ("lower", "than", "cell")):
            if arm is None or arm in values:
                continue
            members = [c for c in cells if c.finished and arm in c.label.split()]
            values[arm] = [_final(client, c, comparison["metric"]) for c in members]
            values[arm] = [v for v in values[arm] if v is not None]
    return values


def _final(client, cell, metric: str) -> float | None:
    if metric == "val/loss":
        return cell.final_loss
    return client.get_run(cell.run_id).data.metrics.get(metric)


def write_paper_report(client, sweep, preset: str, scale: str, claim: dict, out: Path) -> str:
    from results.store import cells_of, generate

    out.mkdir(parents=True, exist_ok=True)
    generate(client, sweep, out, shown_out=out)
    cells = cells_of(client, sweep)
    outcomes = [compare(c, arm_values(client, cells, [c])) for c in claim["comparisons"]]
    verdict = overall(outcomes)
    also = claim.get("also", [])  # secondary comparisons: shown, not part of the verdict
    secondary = [compare(c, arm_values(client, cells, [c])) for c in also]
    tags = sweep.runs[0].data.tags if sweep.runs else {}
    lines = [
        f"# {preset} ({scale} scale)",
        "",
        f"**Claim** ({claim['source']}): {claim['statement']}",
        "",
        f"**Verdict: {verdict} at {scale} scale.** " + " ".join(f"{o.text} → {o.verdict}." for o in outcomes),
        "",
        f"Command: `python run.py -m experiment={preset} scale={scale}`, then "
        f"`python -m results paper --preset {preset} --scale {scale}"
        + (f" --sweep {sweep.sweep_id}" if sweep.sweep_id else "") + "`.",
        "",
        f"Environment: Python {tags.get('python', '?')}, torch {tags.get('torch', '?')}, commit "
        f"{tags.get('git_sha', '?')}, corpus sha256 {tags.get('corpus_sha256', '?')} (data={tags.get('data', '?')}).",
        "",
        *_comparisons_table(outcomes, secondary),
        *_sections(client, cells, claim, out),
        "## Sweep report",
        "",
        (out / "report.md").read_text().split("\n", 1)[1].strip(),
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    write_index(out.parent)
    return verdict


def _comparisons_table(outcomes: list[Outcome], secondary: list[Outcome]) -> list[str]:
    if not outcomes and not secondary:
        return []
    return ["## Comparisons", "", "| comparison | outcome |", "|---|---|",
            *[f"| {o.text} | {o.verdict} |" for o in outcomes],
            *[f"| {o.text} (secondary: not part of the verdict) | {o.verdict} |" for o in secondary], ""]


def _sections(client, cells, claim: dict, out: Path) -> list[str]:
    """Preset-specific sections named by the claim's ``sections`` list (e.g. ``[theta]``)."""
    from results.grid import grid_section
    from results.theta import theta_section

    SECTIONS = {"theta": theta_section, "grid": grid_section}
    lines: list[str] = []
    for name in claim.get("sections", []):
        lines += [*SECTIONS[name](client, cells, out), ""]
    return lines


def write_index(results_dir: Path) -> None:
    """results/README.md: one line per preset report, with its verdict line."""
    rows = []
    for readme in sorted(results_dir.glob("*/README.md")):
        text = readme.read_text().splitlines()
        verdict = next((line for line in text if line.startswith("**Verdict")), "")
        rows.append(f"| [{readme.parent.name}]({readme.parent.name}/README.md) | {text[0].lstrip('# ')} | "
                    f"{verdict.split('**')[1] if verdict else '—'} |")
    (results_dir / "README.md").write_text("\n".join([
        "# results/",
        "",
        "Reports produced by posbench's own commands, each with the command that regenerates it; nothing here",
        "is hand-edited. Paper presets: `python run.py -m experiment=<preset>` then",
        "`python -m results paper --preset <preset>`; benchmarks: `python -m harness.bench --out results/bench`.",
        "",
        "| report | what | verdict / summary |",
        "|---|---|---|",
        *rows,
    ]) + "\n")


def main(args) -> int:
    """Called by ``python -m results paper``."""
    from omegaconf import OmegaConf

    from harness.config.compose import compose
    from results.store import find_sweep, open_store

    cfg = compose([f"experiment={args.preset}", f"scale={args.scale}"])
    claim = OmegaConf.to_container(cfg.claim, resolve=True)
    uri, client = open_store(args.tracking_uri)
    try:
        sweep = find_sweep(client, cfg.logger.experiment, args.sweep)
    except LookupError as e:
        raise LookupError(f"{e} (store: {uri}); run `python run.py -m experiment={args.preset}` first") from None
    out = Path(args.out)
    verdict = write_paper_report(client, sweep, args.preset, args.scale, claim, out)
    print(f"{args.preset}: {verdict} ({out / 'README.md'})")
    return 0
