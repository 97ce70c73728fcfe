"""The project's structure, read from its own imports and docstrings: no circles, rooms import what they declare
and nothing less, each package's docstring names every module it holds, and a module name two rooms share is
explained in both.

Every import statement of the project's code counts, including those inside functions (a lazy
import is still a dependency). A *room* is a subpackage of harness/ (``harness.record``), one of
harness's top-level modules (``harness.train``), or a top-level package (``positional``); its
docstring's ``May import:`` paragraph names the rooms it may use. ``harness.errors``, ``harness.ranges``,
``harness.paths``, ``harness.allocator``, ``harness.signals``, ``harness.extras``, ``harness.integrity``,
``harness.markdown``, ``harness.stats`` and ``harness.sequential`` are the ground: anyone may import them.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGES = ("harness", "positional", "attention", "results")
GROUND = {
    "harness.errors",
    "harness.ranges",
    "harness.paths",
    "harness.allocator",
    "harness.signals",
    "harness.extras",
    "harness.integrity",
    "harness.markdown",
    "harness.stats",
    "harness.sequential",
}


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `from x.y import name`: the module is x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@functools.cache  # parsing every file is the cost; collection asks for the graph once per room
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def room_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one node (or a self-loop): Tarjan."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


@functools.cache
def room_graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph().items():
        src = room_of(module)
        rooms.setdefault(src, set()).update(room_of(t) for t in targets if room_of(t) != src)
    return rooms


def declared(room: str) -> set[str]:
    """The rooms named in the room's ``May import:`` paragraph."""
    modules = project_modules()
    doc = ast.get_docstring(ast.parse(modules[room].read_text())) or ""
    match = re.search(r"May import:(.*?)(?:\n\s*\n|$)", doc, re.S)
    assert match, f"{room}'s docstring has no 'May import:' paragraph"
    named = set(re.findall(r"\b(harness\.\w+|positional|attention|results)\b", match.group(1)))
    return {room_of(n) for n in named}


def test_the_project_modules_are_found():
    modules = project_modules()
    expected = {"harness.train", "harness.record.run", "positional.rope", "attention.softmax", "results.report"}
    assert expected <= set(modules)
    assert "harness.record.store" in graph()["harness.record.run"]  # an import is seen


def test_the_import_parser_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("import p.a\n")
    modules = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    edges = {n: imports_of(f, n, modules) for n, f in modules.items()}
    assert edges["p.a"] == {"p.b"} and edges["p.b"] == {"p.a"}
    assert cycles(edges) == [["p.a", "p.b"]]  # the detector finds a circle when there is one


def test_no_module_imports_a_module_that_imports_it_back():
    assert cycles(graph()) == []


def test_no_room_imports_a_room_that_imports_it_back():
    assert cycles(room_graph()) == []


@pytest.mark.parametrize("room", sorted(r for r in room_graph() if r not in GROUND and r != "harness"))
def test_each_room_imports_only_what_its_docstring_declares(room):
    used = room_graph()[room] - GROUND - {"harness"}
    assert used <= declared(room), f"{room} imports {sorted(used - declared(room))} without declaring it"


@pytest.mark.parametrize(
    "room",
    sorted(r for r, path in project_modules().items() if r in room_graph() and "May import:" in path.read_text()),
)
def test_each_room_imports_everything_its_docstring_declares(room):
    """A ``May import:`` line is the room's dependencies, not a wish list: a room it names and no longer imports
    (or a ground module named in it) makes the line false."""
    unused = declared(room) - room_graph()[room]
    assert not unused, f"{room}'s 'May import:' names {sorted(unused)}, which none of its modules imports"


def packages() -> list[Path]:
    """Every folder of the project's packages that holds an ``__init__.py``."""
    return sorted(init.parent for pkg in PACKAGES for init in (ROOT / pkg).rglob("__init__.py"))


def unnamed(package: Path, root: Path = ROOT) -> list[str]:
    """The modules and subpackages ``package`` holds that its ``__init__`` docstring does not name: as ``name``
    (double or single backquotes), ``name.py`` or ``name/``; ``__main__`` as ``python -m <package>``; and a module
    that is an option, ``conf/<group>/<name>.yaml``, by the docstring stating that rule for its group."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    dotted = ".".join(package.relative_to(root).parts)
    option_groups = re.findall(r"conf/(\w+)/<name>\.yaml", doc)
    held = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    held += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = []
    for name in sorted(held):
        forms = rf"``{name}``|(?<!`)`{name}`(?!`)|(?<![\w/.]){name}\.py\b|(?<![\w/.]){name}/"
        if name == "__main__":
            forms += rf"|python -m {re.escape(dotted)}\b"
        if re.search(forms, doc) or any((root / "conf" / g / f"{name}.yaml").is_file() for g in option_groups):
            continue
        missing.append(name)
    return missing


def test_the_docstring_check_finds_an_unnamed_module(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        '"""Owns: ``a``, b.py and sub/; c is only a word here; d options:\nconf/grp/<name>.yaml ↔ p/<name>.py."""\n'
    )
    for name in ("a", "b", "c", "d", "e", "__main__"):
        (pkg / f"{name}.py").write_text("")
    (tmp_path / "conf" / "grp").mkdir(parents=True)
    (tmp_path / "conf" / "grp" / "d.yaml").write_text("")
    assert unnamed(pkg, tmp_path) == ["__main__", "c", "e"]  # d: an option of conf/grp, named by the rule


def unexplained_shared_names(root: Path = ROOT) -> list[str]:
    """``path: other`` for each module whose basename another package's module also has, and whose package's
    ``__init__`` docstring does not name that other module by its path (saying why this room has its own)."""
    by_name: dict[str, list[Path]] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            if path.stem not in ("__init__", "__main__"):
                by_name.setdefault(path.stem, []).append(path)
    out = []
    for paths in by_name.values():
        for path in paths:
            doc = ast.get_docstring(ast.parse((path.parent / "__init__.py").read_text())) or ""
            out += [
                f"{path.relative_to(root)}: {other.relative_to(root)}"
                for other in paths
                if other != path and str(other.relative_to(root)) not in doc
            ]
    return out


def test_a_module_name_two_rooms_share_is_explained_in_each():
    """One name, several things (two ``Cell`` classes, four ``scale``s) is what a reader trips on: a basename
    used in two packages is allowed where each package's docstring names the other module and says why."""
    assert unexplained_shared_names() == []


def test_the_shared_name_check_finds_an_unexplained_one(tmp_path):
    for pkg, doc in (
        ("harness", "``report``: this room's, where results/report.py is the sweep's"),
        ("results", "``report``"),
    ):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(f'"""{doc}"""\n')
        (tmp_path / pkg / "report.py").write_text("")
    for pkg in ("positional", "attention"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    assert unexplained_shared_names(tmp_path) == ["results/report.py: harness/report.py"]


@pytest.mark.parametrize("package", packages(), ids=lambda p: ".".join(p.relative_to(ROOT).parts))
def test_each_package_docstring_names_every_module_it_holds(package):
    """A package's ``__init__`` docstring is its table of contents: a module or subpackage it does not name is
    one a reader of the docstring does not know is there."""
    missing = unnamed(package)
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {missing}"


def words_of(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def own_business(root: Path = ROOT) -> list[str]:
    """``path: name`` for each public top-level function that no other file names: not another module, a test,
    run.py, conf/, docs/, the README, CONTRIBUTING or pyproject.toml. Only its own module calls it, so it is the
    module's own business: ``_name``, and a reader learns one name fewer."""
    sources = [p for pkg in (*PACKAGES, "tools") for p in sorted((root / pkg).rglob("*.py"))]
    others = [*(root / "tests").rglob("*.py"), *(root / "conf").rglob("*.yaml"), *(root / "docs").rglob("*.md")]
    others += [root / name for name in ("run.py", "README.md", "CONTRIBUTING.md", "pyproject.toml")]
    words = {p: words_of(p.read_text(encoding="utf-8")) for p in sources + others if p.is_file()}
    out = []
    for path in sources:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name == "main":
                continue
            if not any(node.name in seen for other, seen in words.items() if other != path):
                out.append(f"{path.relative_to(root)}: {node.name}")
    return out


def test_a_public_function_is_named_outside_its_module():
    """The public names are a module's interface, what a newcomer has to learn; a helper only its own module calls
    is written ``_name``, so the interface does not grow with every helper."""
    assert own_business() == []


def test_the_public_function_check_finds_one_only_its_module_calls(tmp_path):
    for folder in ("harness", "tests"):
        (tmp_path / folder).mkdir()
    (tmp_path / "harness" / "a.py").write_text(
        "def used(): ...\ndef alone(): ...\ndef _private(): ...\ndef main(): ...\n"
    )
    (tmp_path / "tests" / "test_a.py").write_text("from harness.a import used\n")
    assert own_business(tmp_path) == ["harness/a.py: alone"]
