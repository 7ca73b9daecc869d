"""docs/design.md stays true to the code: every code name it gives exists, and its layer list
is the import contract `make lint` enforces. A rename that leaves the doc behind fails here."""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from api.failures import FAILURE_CLASSES

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
PACKAGES = ("api", "controller", "agent", "cli", "localcluster", "benchmarks")

_CODE = re.compile(r"`([^`\n]+)`")
_SNAKE = re.compile(r"^_?[a-z][a-z0-9]*(_[a-z0-9]+)+$|^_[a-z][a-z0-9]*$")
_UPPER = re.compile(r"^_?[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")
_QUALIFIED = re.compile(r"^([A-Z][A-Za-z0-9]*)\.(_?[a-z][a-z0-9_]*)$")
_DOTTED = re.compile(r"^(" + "|".join(PACKAGES) + r")(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_PATH = re.compile(r"^[\w./-]+\.(py|md|yaml|toml)$")


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from (REPO / package).rglob("*.py")


def _class_members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: methods, fields, class attributes, and `self.x` it assigns."""
    inside: set[str] = set()
    for item in cls.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            inside.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            inside.add(item.target.id)
        elif isinstance(item, ast.Assign):
            inside.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [target] if target else []
        for t in targets:
            match t:
                case ast.Attribute(value=ast.Name(id="self"), attr=attr):
                    inside.add(attr)
    return inside


@cache
def _definitions() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """Every name defined in the project's code (functions, classes, assignments, fields,
    modules, and the strings of api/constants.py: the protocol's names), and each class's
    members."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    for path in _sources():
        names.add(path.stem)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(node.name)
                members.setdefault(node.name, set()).update(_class_members(node))
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif path.name == "constants.py" and isinstance(node, ast.Constant):
                names.add(str(node.value))
    return frozenset(names), {k: frozenset(v) for k, v in members.items()}


def _module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:end])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            rest = parts[end:]
            names, _ = _definitions()
            return all(name in names for name in rest)
    return False


def code_names(text: str) -> list[str]:
    """The backticked spans of the doc that name code (not fields, labels or values)."""
    found = []
    for span in _CODE.findall(text):
        token = span.strip().removesuffix("()")
        if (
            _SNAKE.match(token)
            or _UPPER.match(token)
            or _QUALIFIED.match(token)
            or _DOTTED.match(token)
            or (_PATH.match(token) and "/" in token)
        ):
            found.append(token)
    return found


def exists(token: str) -> bool:
    names, members = _definitions()
    if _PATH.match(token) and "/" in token:
        # Relative to the repository, or (as the doc's tables say) to controller/.
        path = token.removeprefix("../")
        return (REPO / path).exists() or (REPO / "controller" / path).exists()
    if (REPO / token).is_file():
        return True  # a file at the top, e.g. a Dockerfile
    top = token.split(".")[0]
    if top not in PACKAGES and token not in names and importlib.util.find_spec(top) is not None:
        return True  # a library the doc names, e.g. kubernetes_asyncio
    if _DOTTED.match(token):
        return _module_exists(token)
    qualified = _QUALIFIED.match(token)
    if qualified:
        cls, member = qualified.groups()
        return member in members.get(cls, frozenset())
    return token in names


_LOCATED = re.compile(r"`([\w/.-]+\.py)`((?:,? `[^`]+`)+)")


@cache
def _defined_in(path: Path) -> frozenset[str]:
    """Names a module defines at its top level, and its classes' members, as `Class.member`
    and alone (the doc names a method of the module's class by its name)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            members = _class_members(node)
            names.update(members)
            names.update(f"{node.name}.{m}" for m in members)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def located_names(text: str) -> list[tuple[str, str]]:
    """(module path, name) for each "`module.py` `name`, `other`" of the doc: names it says
    that module defines."""
    found = []
    for path, names in _LOCATED.findall(text):
        for name in _CODE.findall(names):
            if not _PATH.match(name):  # another file, not a name in this one
                found.append((path, name.removesuffix("()")))
    return found


def defined_where_said(path: str, name: str) -> bool:
    relative = path.removeprefix("../")
    module = REPO / relative
    if not module.exists():
        module = REPO / "controller" / relative
    if not module.exists():
        module = REPO / "agent" / relative
    return module.exists() and name in _defined_in(module)


def test_the_doc_names_code() -> None:
    # Guards the guard: if the doc's code names stopped being found, nothing would be checked.
    assert len(code_names(DESIGN.read_text())) > 100


def test_every_code_name_in_the_design_doc_exists() -> None:
    missing = sorted({t for t in code_names(DESIGN.read_text()) if not exists(t)})
    assert missing == []


def test_every_name_the_doc_places_in_a_module_is_defined_there() -> None:
    located = located_names(DESIGN.read_text())
    assert len(located) > 30
    misplaced = sorted({f"{p} {n}" for p, n in located if not defined_where_said(p, n)})
    assert misplaced == []


@pytest.mark.parametrize(
    ("token", "found"),
    [
        ("arrivals_app", True),
        ("make_app", False),
        ("Reconciler.act", True),
        ("Reconciler.acts", False),
        ("controller/policy/plan.py", True),
        ("controller.policy.restart", True),
        ("controller.policy.nothing", False),
    ],
)
def test_the_check_tells_a_renamed_name(token: str, found: bool) -> None:
    assert code_names(f"`{token}`") == [token]
    assert exists(token) is found


def _doc_layers() -> list[set[str]]:
    line = next(ln for ln in DESIGN.read_text().splitlines() if "layers, top to bottom:" in ln)
    text = line.split("layers, top to bottom:", 1)[1]
    # The list may wrap onto the next lines, up to its closing semicolon.
    rest = DESIGN.read_text().split(line, 1)[1]
    text += " " + rest.split(";", 1)[0]
    return [set(_CODE.findall(seg)) for seg in text.split(">") if _CODE.findall(seg)]


def test_the_layer_list_is_the_import_contract() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    assert _doc_layers() == [{m.strip() for m in layer.split("|")} for layer in layers]


def test_the_class_table_is_api_failures() -> None:
    text = DESIGN.read_text().split("### 4.3", 1)[1].split("### 4.4", 1)[0]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    documented = []
    for row in rows:
        cls, action, counted, infrastructure = (c.strip() for c in row.strip("|").split("|"))
        documented.append(
            (cls.strip("`"), _CODE.findall(action)[0], counted == "yes", infrastructure == "yes")
        )
    table = [
        (str(c), str(m.action), m.counted, m.infrastructure) for c, m in FAILURE_CLASSES.items()
    ]
    assert documented == table
