"""The package's shape: modules small enough to read whole, and no import circles.

Imports are read from the source (``ast``), so an import made only for type checkers
(``if TYPE_CHECKING:``) or inside a function counts as much as one at the top: a module
that needs another, even for an annotation, depends on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_tasks

PACKAGE = Path(durable_tasks.__file__).parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    """``durable_tasks/store/__init__.py`` -> ``durable_tasks.store``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of the package that ``path`` imports, wherever the import statement is.

    ``from .x import name`` depends on ``x.name`` when that is a module, else on ``x``; the
    package a module lives in is not counted unless it is named (``from . import x`` names x).
    """
    this = module_name(path)
    package = this.split(".") if path.name == "__init__.py" else this.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {m for m in found if m in modules and m != this}


def import_graph() -> dict[str, set[str]]:
    """Every module of the package and the modules of the package it imports."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(circle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(circle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in circle)


def test_no_module_of_the_package_is_over_400_lines() -> None:
    too_long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concern): {too_long}"


def test_no_import_circle_among_the_modules_of_the_package() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (TYPE_CHECKING and function-level imports count): " + " | ".join(
        describe(c, graph) for c in found
    )


def test_the_circle_check_sees_circles_and_typing_imports() -> None:
    """The check itself can fail: a circle closed only by a TYPE_CHECKING import is found."""
    graph = import_graph()
    assert "durable_tasks.app" in graph["durable_tasks.cli.base"]
    assert "durable_tasks.runtime" in graph["durable_tasks.signals"]  # imported under TYPE_CHECKING only
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
