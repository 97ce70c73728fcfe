"""Figures computed from the schemes' own maths: ``python -m results.figures <name> [--out DIR]``.

Each figure writes a CSV, a PNG and a README (with the regenerating command) under
``results/<name>/``; nothing there is hand-edited.

  rope_decay  Su's long-range decay bound for RoPE (RoFormer §3.4.3, Eqs. 35–36, Fig. 2)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from harness.integrity import report_folder
from harness.paths import project_root
from positional.rope import rope_inv_freq


def rope_decay_bound(distances: Tensor, head_dim: int = 128, base: float = 10000.0) -> Tensor:
    """(1/(d/2)) · Σ_{j=1}^{d/2} |S_j|, S_j = Σ_{i=0}^{j−1} e^{i·m·θ_i}: the factor Σ|S_j| of the
    bound in RoFormer §3.4.3 (Eq. 36), averaged over j as plotted in its Fig. 2.

    θ_i = base^(−2i/d) with i = 0 … d/2−1, so θ_0 = 1 and S_j sums the j fastest frequencies.
    (RoFormer Eq. 15 writes θ_i = base^(−2(i−1)/d) for i = 1 … d/2 — the same set — while the
    Abel-summation section sums from i = 0; the set, not the index, is what matters. Su's blog
    uses the 0-indexed form.) At m = 0, S_j = j and the bound is (d/2 + 1)/2.
    distances: (M,) relative distances m − n. Returns (M,) float64.
    """
    theta = rope_inv_freq(head_dim, base, torch.float64)  # (d/2,)
    phases = torch.polar(
        torch.ones(len(distances), len(theta), dtype=torch.float64),
        distances.to(torch.float64)[:, None] * theta[None, :],
    )  # (M, d/2) e^{i m θ_i}
    partial = phases.cumsum(dim=-1)  # (M, d/2): column j−1 holds S_j
    return partial.abs().mean(dim=-1)


def rope_decay(out: Path) -> None:
    """Su's relative upper bound for d = 128, base 10000, m = 0 … 256, into ``out`` (``main``'s staging folder)."""
    from results.plots import plt, save

    m = torch.arange(0, 257)
    bound = rope_decay_bound(m)
    rows = ["m,bound"] + [f"{i},{b:.6f}" for i, b in zip(m.tolist(), bound.tolist(), strict=True)]
    (out / "rope_decay.csv").write_text("\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(m.numpy(), bound.numpy(), lw=1.2)
    ax.set(xlabel="relative distance m − n", ylabel="relative upper bound  (1/(d/2)) Σ_j |S_j|")
    ax.set_title("RoPE long-term decay bound (RoFormer §3.4.3)\nd = 128, base = 10000", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, out / "rope_decay.png", dpi=120, metadata={"Software": None})
    picks = ", ".join(f"m={i}: {bound[i]:.4f}" for i in (0, 16, 64, 256))
    (out / "README.md").write_text(
        "# rope_decay\n\n"
        "Su's long-range decay bound for RoPE, (1/(d/2))·Σ_{j=1..d/2} |Σ_{i=0}^{j−1} e^{i·m·θ_i}| with\n"
        "θ_i = 10000^(−2i/d), d = 128, m = 0 … 256 (RoFormer §3.4.3, Fig. 2).\n\n"
        f"Values: {picks}.\n\n"
        "Regenerate: `python -m results.figures rope_decay`\n"
    )


FIGURES: dict[str, Callable[[Path], None]] = {"rope_decay": rope_decay}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m results.figures", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(FIGURES))
    parser.add_argument("--out", type=Path, default=None, help="output folder (default results/<name>)")
    args = parser.parse_args(argv)
    out = args.out or project_root() / "results" / args.name
    with report_folder(out) as staging:  # written whole or not at all, then sealed (harness/integrity.py)
        FIGURES[args.name](staging)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
