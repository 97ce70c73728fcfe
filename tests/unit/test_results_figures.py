"""results.figures: Su's RoPE decay bound against a term-by-term sum, and the files it writes."""

import cmath

import pytest
import torch

from results.figures import main, rope_decay_bound
from tests.helpers import assert_figure


def bound_by_hand(m: int, d: int = 128, base: float = 10000.0) -> float:
    theta = [base ** (-2 * i / d) for i in range(d // 2)]  # θ_0 = 1 … θ_{d/2−1}
    partial, total = 0j, 0.0
    for j in range(1, d // 2 + 1):  # S_j = Σ_{i=0}^{j−1} e^{i m θ_i}
        partial += cmath.exp(1j * m * theta[j - 1])
        total += abs(partial)
    return total / (d // 2)


def test_bound_matches_the_sum_written_out():
    ms = [0, 1, 16, 64, 100, 256]
    got = rope_decay_bound(torch.tensor(ms))
    assert got.tolist() == pytest.approx([bound_by_hand(m) for m in ms], rel=1e-12)
    assert got[0].item() == pytest.approx(32.5)  # S_j = j at m = 0: mean of 1 … 64
    assert rope_decay_bound(torch.tensor([0]), head_dim=8).item() == pytest.approx(2.5)


def test_command_writes_csv_png_and_readme(tmp_path):
    main(["rope_decay", "--out", str(tmp_path)])
    rows = (tmp_path / "rope_decay.csv").read_text().splitlines()
    assert rows[0] == "m,bound" and len(rows) == 1 + 257 and rows[1] == "0,32.500000"
    assert_figure(tmp_path / "rope_decay.png")
    assert "python -m results.figures rope_decay" in (tmp_path / "README.md").read_text()
