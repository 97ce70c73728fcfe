"""The README and docs/ against the code, one way: what a table row says must be true, what it leaves out is
allowed (a scheme added later shows up in ``posbench --list`` without touching the docs).

- docs/schemes.md's scheme table: each row names conf/pos/<name>.yaml, and its hooks and logit-bias kind are
  the class's declarations (``hooks()``, ``bias_kind``); its attention table likewise (``accepts_bias``);
- the README's preset table names presets that exist;
- the README stays a user guide (at most ``MAX_README_LINES`` lines), every relative link in README.md and
  docs/*.md reaches a file (and a heading, for a ``#fragment`` into markdown), no session history (an issue's
  number) and no pasted compatibility matrix (``python run.py --matrix=md`` is the live one);
- code, tests and configs hold no history either: no issue numbers and no commit hashes (git holds the story;
  measurements live in results/ and docs/, written by the commands that measure them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
SCHEMES = DOCS / "schemes.md"
MAX_README_LINES = 260


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def split_row(line: str) -> list[str]:
    """A markdown table row's cells (``\\|`` is a pipe inside a cell); [] for a line that is no row."""
    line = line.strip()
    if not line.startswith("|"):
        return []
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def table(path: Path, first_header: str) -> list[dict[str, str]]:
    """The rows, as {header: cell}, of the table in ``path`` whose first header cell is ``first_header``."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        header = split_row(line)
        if header[:1] == [first_header]:
            rows = []
            for row in lines[i + 2 :]:  # past the |---| line
                cells = split_row(row)
                if not cells:
                    break
                rows.append(dict(zip(header, cells, strict=True)))
            assert rows, f"{path.name}: the table headed {first_header} has no rows"
            return rows
    raise AssertionError(f"{path.relative_to(ROOT)}: no table whose first column is headed {first_header}")


def ticked(cell: str) -> list[str]:
    """The `code` spans of a cell: the names it states ("—" and prose around them are not read)."""
    return re.findall(r"`([^`]+)`", cell)


def row_name(row: dict[str, str], column: str) -> str:
    names = ticked(row[column])
    assert len(names) == 1, f"{column} cell {row[column]!r} must name one option in backticks"
    return names[0].removesuffix("=")


SCHEME_ROWS = table(SCHEMES, "`pos=`")
VARIANT_ROWS = table(SCHEMES, "`attn=`")


@pytest.fixture(scope="module")
def classes() -> dict[str, dict[str, type]]:
    from harness.config.catalog import option_classes

    return {group: option_classes(group) for group in ("pos", "attn")}


@pytest.mark.parametrize("row", SCHEME_ROWS, ids=lambda r: row_name(r, "`pos=`"))
def test_scheme_row_states_the_class_declarations(row, classes):
    name = row_name(row, "`pos=`")
    assert (ROOT / "conf" / "pos" / f"{name}.yaml").is_file(), f"docs/schemes.md lists pos={name}: no YAML"
    cls = classes["pos"][name]
    assert set(ticked(row["hooks"])) == set(cls.hooks()), (
        f"docs/schemes.md: pos={name} hooks {row['hooks']!r}, the class declares {sorted(cls.hooks())}"
    )
    assert ticked(row["logit bias"]) == [cls.bias_kind], (
        f"docs/schemes.md: pos={name} logit bias {row['logit bias']!r}, the class declares {cls.bias_kind!r}"
    )


@pytest.mark.parametrize("row", VARIANT_ROWS, ids=lambda r: row_name(r, "`attn=`"))
def test_variant_row_states_the_accepted_bias_kinds(row, classes):
    name = row_name(row, "`attn=`")
    assert (ROOT / "conf" / "attn" / f"{name}.yaml").is_file(), f"docs/schemes.md lists attn={name}: no YAML"
    cls = classes["attn"][name]
    assert set(ticked(row["accepts bias"])) == set(cls.accepts_bias), (
        f"docs/schemes.md: attn={name} accepts {row['accepts bias']!r}, the class declares {sorted(cls.accepts_bias)}"
    )


def test_readme_presets_exist():
    for row in table(README, "preset"):
        name = row_name(row, "preset")
        assert (ROOT / "conf" / "experiment" / f"{name}.yaml").is_file(), f"README lists experiment={name}: no preset"


def test_readme_is_a_user_guide():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail into docs/"


def prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans, where links are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+\s+(.*)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), flags=re.M)
    return {slug(h) for h in headings}


def links(path: Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(path.read_text()))


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file here
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{path.relative_to(ROOT)}: broken links: {'; '.join(broken)}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_history_or_pasted_matrix(path):
    text = path.read_text()
    history = re.findall(r"\bissue\s+#?\d+", text, flags=re.I)
    assert not history, f"{path.relative_to(ROOT)} mentions {history}: state the rule, not the story"
    assert not re.search(r"^\|\s*pos \\ attn\s*\|", text, flags=re.M), (
        f"{path.relative_to(ROOT)} holds a pasted compatibility matrix; point to python run.py --matrix instead"
    )


# Where history must not be: the code, the tests and the configs (results/ only its code: its folders are reports).
HISTORY_FREE_DIRS = ("harness", "positional", "attention", "tools", "tests", "conf", "hydra_plugins")
HISTORY_FREE_FILES = ("run.py", "Makefile", "pyproject.toml")
HISTORY_FREE_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".sh", ""}
ISSUE_REF = re.compile(
    r"\bissues?\s*#?\d+|\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?|see|PR)\s+#\d+|\(#\d+\)|\bgh-\d+", flags=re.I
)
# 7 to 40 lowercase hex digits with a digit and a letter, not inside a longer word or number
COMMIT_HASH = re.compile(r"(?<![\w.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
HEX_WORDS_ALLOWED = frozenset(
    {
        "0123456789abcdef",  # the alphabet a sha256 line is checked against (harness/integrity.py)
        "0123abcd",  # a made-up run id in tools/fuzz.py's damaged records
    }
)


def history_free_files() -> list[Path]:
    files = [ROOT / name for name in HISTORY_FREE_FILES]
    for folder in HISTORY_FREE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT)
            if (
                path.is_file()
                and path.suffix in HISTORY_FREE_SUFFIXES
                and rel.parts[:2] != ("tests", "data")
                and not any(p.startswith(".") or p == "__pycache__" for p in rel.parts)
            ):
                files.append(path)
    return [*files, *sorted((ROOT / "results").rglob("*.py"))]


def history_in(pattern: re.Pattern, allowed: frozenset[str] = frozenset()) -> list[str]:
    """``path:line: match`` for every match of ``pattern`` in the code, tests and configs."""
    found = []
    for path in history_free_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m}" for m in pattern.findall(line) if m not in allowed]
    return found


def test_code_tests_and_configs_name_no_issue_numbers():
    found = history_in(ISSUE_REF)
    assert not found, "state the behaviour, not the issue it came from:\n" + "\n".join(found)


def test_code_tests_and_configs_name_no_commit_hashes():
    found = history_in(COMMIT_HASH, HEX_WORDS_ALLOWED)
    assert not found, "a commit belongs in git, not in the code:\n" + "\n".join(found)
