"""The shape every script keeps: records built by name, imports one way."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "algos").glob("*.py")) + sorted((ROOT / "common").glob("*.py"))


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def record_types() -> set[str]:
    """Every NamedTuple class of algos/ and common/."""
    return {
        node.name
        for path in SOURCES
        for node in ast.walk(tree(path))
        if isinstance(node, ast.ClassDef)
        and any(getattr(b, "id", "") == "NamedTuple" for b in node.bases)
    }


def test_records_are_built_by_name():
    """A positional `Transition(obs, action, value, log_prob, ...)` runs silently when two
    same-shaped fields swap."""
    records = record_types()
    assert {"RunnerState", "Transition", "Replay", "Policy", "Layout"} <= records
    positional = []
    for path in SOURCES:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Call):
                name = (
                    node.func.attr
                    if isinstance(node.func, ast.Attribute)
                    else getattr(node.func, "id", "")
                )
                if name in records and node.args:
                    positional.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not positional, f"records built with positional arguments: {positional}"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_imports_go_one_way(path):
    """common/ never imports algos/; a script never imports another (each reads top to bottom on its
    own)."""
    algos = {
        name for name in imported_modules(path) if name == "algos" or name.startswith("algos.")
    }
    assert not algos, f"{path.relative_to(ROOT)} imports {sorted(algos)}"


def test_common_modules_import_each_other_one_way():
    """common/'s modules import each other in one direction (type-checking imports included): each
    can be read, and changed, knowing only the modules below it."""
    modules = {path.stem for path in (ROOT / "common").glob("*.py")}
    below = {
        name: {
            m.split(".")[1]
            for m in imported_modules(ROOT / "common" / f"{name}.py")
            if m.startswith("common.") and m.split(".")[1] in modules
        }
        for name in modules
    }

    def cycle_from(name, path):
        for other in sorted(below[name]):
            if other in path:
                return path[path.index(other) :] + [other]
            found = cycle_from(other, path + [other])
            if found:
                return found
        return None

    for name in sorted(modules):
        cycle = cycle_from(name, [name])
        assert cycle is None, "common/ imports in a circle: " + " -> ".join(cycle)
