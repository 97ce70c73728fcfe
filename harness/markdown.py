"""Markdown tables, written one way for every report: the sweep's, the paper's, the benchmarks', hf-eval's and
the option catalogue's; and the CSV text of a table (``csv_text``), for every CSV a report or a run writes."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence


def table(head: Sequence[str], rows: Iterable[Sequence[object]], align: str = "", escape: bool = False) -> list[str]:
    """A markdown table's lines. ``align``: a letter per column, ``r`` for a right-aligned one (default: all left).
    ``escape``: a ``|`` inside a row's cell is written ``\\|`` so that it cannot split the column; off, cells are
    written as they are (a report whose text says ``|Δ|`` keeps it)."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align or "l" * len(head))
    cell = (lambda x: str(x).replace("|", "\\|")) if escape else str
    return [f"| {' | '.join(head)} |", f"|{rule}", *(f"| {' | '.join(cell(x) for x in row)} |" for row in rows)]


def csv_text(head: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A table as ``csv.writer`` writes it (``\\r\\n`` line ends): the head's row, then each row's; None is
    written as an empty field."""
    out = io.StringIO()
    csv.writer(out).writerows([head, *rows])
    return out.getvalue()
