"""The installed package holds the library only: what serves the repository's tests and examples
stays in tests/ and examples/ (a pip-installed durable_tasks has neither)."""

from __future__ import annotations

import ast
from pathlib import Path

import typer.main

import durable_tasks.embedded
from durable_tasks.cli import cli

PACKAGE = Path(durable_tasks.embedded.__file__).resolve().parent


def test_no_module_of_the_package_imports_the_repository_folders() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"examples", "tests", "benchmarks"}]
    assert offenders == []


def test_the_embedded_postgres_of_the_tests_is_not_in_the_package() -> None:
    assert not hasattr(durable_tasks.embedded, "start_embedded_postgres")
    assert not any("embedded_postgres" in path.read_text() for path in PACKAGE.rglob("*.py"))


def test_the_demo_is_not_a_command_of_the_library() -> None:
    commands = typer.main.get_command(cli).commands  # type: ignore[attr-defined]
    assert "demo" not in commands
    assert {"run", "worker", "init-db"} <= set(commands)
