"""Every code block and command line in the repository's Markdown is run or checked, so the
docs cannot drift from the code: the convention is in tests/docs/README.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import durable_tasks
from durable_tasks.cli import cli

from .commands import Command, check_command, make_targets, shell_commands
from .markdown import SHELL_KINDS, Block, Page, slugs
from .pages import (
    DEFAULT_TIMEOUT,
    REPO,
    Program,
    kill_leftovers,
    load_pages,
    matches_output,
    missing_urls,
    programs,
    run_in,
    shell_runs,
)

PAGES, BROKEN = load_pages()
PROGRAMS = [p for page in PAGES for p in programs(page)[0]]
EXCERPTS = [b for page in PAGES for b in page.blocks if b.excerpt_of is not None]
SHELL_RUNS = [b for page in PAGES for b in shell_runs(page)]
#: Kinds of block that are shown, not run: the harness knows every kind it lets through.
SHOWN_KINDS = frozenset({"text", "output", "sql", "json", "yaml", "toml", "ini", "dockerfile", "lua", "diff"})


def _page_id(page: Page) -> str:
    return page.path.as_posix()


def _page_commands(page: Page) -> list[tuple[str, Command, bool]]:
    """(where, command, complete): command lines in shell blocks are complete; a command in
    inline code may be named without its arguments."""
    found: list[tuple[str, Command, bool]] = []
    for block in page.blocks:
        if block.kind in SHELL_KINDS:
            found += [(block.where, c, True) for c in shell_commands(block.code, prompts=block.kind == "console")]
    for code in page.inline_code:
        if re.match(r"(durable-tasks|make|python3? -m)( |$)", code.text):
            found += [(f"{code.path.as_posix()}:{code.line}", c, False) for c in shell_commands(code.text)]
    return found


def _program_words(words: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """('durable-tasks' | 'make' | 'module:NAME', rest) for the commands the docs tests know."""
    if not words:
        return None
    program = Path(words[0]).name
    if program == "durable-tasks":
        return "durable-tasks", words[1:]
    if program == "make":
        return "make", words[1:]
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and len(words) > 2 and words[1] == "-m":
        if words[2] == "durable_tasks":
            return "durable-tasks", words[3:]
        return f"module:{words[2]}", words[3:]
    return None


def test_markers_parse() -> None:
    assert not BROKEN, "\n".join(BROKEN.values())


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_block_says_what_it_is(page: Page) -> None:
    unknown = [
        f"{b.where}: ```{b.kind or '(nothing)'}"
        for b in page.blocks
        if b.kind not in SHOWN_KINDS | SHELL_KINDS | {"python"}
    ]
    assert not unknown, (
        "fenced blocks must name their kind: python (run), bash/console (checked), or one shown "
        f"as is ({', '.join(sorted(SHOWN_KINDS))}):\n" + "\n".join(unknown)
    )
    assert not programs(page)[1], "\n".join(programs(page)[1])


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.where)
def test_python_block_runs(program: Program, tmp_path: Path) -> None:
    if missing := missing_urls(program.code):
        pytest.skip(f"the block reads {', '.join(missing)}, which is not set")
    (tmp_path / "block.py").write_text(program.code)
    for page in PAGES:  # files the page saves are there for its programs too
        for block in page.blocks:
            if block.save_as and page.path == program.last.path and block not in program.blocks:
                (tmp_path / block.save_as).write_text(block.code)
    try:
        done = run_in(tmp_path, ["python", "block.py"], program.last.timeout or DEFAULT_TIMEOUT)
    finally:
        kill_leftovers(tmp_path)
    assert done.returncode == 0, f"{program.where} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    if program.last.output is not None:
        assert matches_output(program.last.output.code, done.stdout), (
            f"{program.where} printed:\n{done.stdout}\nthe docs show:\n{program.last.output.code}"
        )


@pytest.mark.parametrize("block", SHELL_RUNS, ids=lambda b: b.where)
def test_shell_block_runs(block: Block, tmp_path: Path) -> None:
    for page in PAGES:
        if page.path == block.path:
            for saved in page.blocks:
                if saved.save_as:
                    (tmp_path / saved.save_as).write_text(saved.code)
    script = (
        "\n".join(line.lstrip()[2:] for line in block.code.splitlines() if line.lstrip().startswith("$ "))
        if block.kind == "console"
        else block.code
    )
    (tmp_path / "block.sh").write_text(script)
    try:
        done = run_in(tmp_path, ["bash", "-euo", "pipefail", "block.sh"], block.timeout or DEFAULT_TIMEOUT)
    finally:
        kill_leftovers(tmp_path)
    assert done.returncode == 0, f"{block.where} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    if block.output is not None:
        assert matches_output(block.output.code, done.stdout), (
            f"{block.where} printed:\n{done.stdout}\nthe docs show:\n{block.output.code}"
        )


def _normalized(line: str) -> str:
    return " ".join(re.sub(r"\s+#.*$", "", line).split())


@pytest.mark.parametrize("block", EXCERPTS, ids=lambda b: b.where)
def test_excerpt_is_in_its_file(block: Block) -> None:
    assert block.excerpt_of is not None
    source = REPO / block.excerpt_of
    assert source.is_file(), f"{block.where}: excerpt of {block.excerpt_of}, which does not exist"
    lines = iter(_normalized(line) for line in source.read_text().splitlines())
    for wanted in (_normalized(line) for line in block.code.splitlines()):
        if wanted in ("", "...", "# ..."):
            continue
        assert any(line == wanted for line in lines), (
            f"{block.where}: {wanted!r} is not in {block.excerpt_of} (or not in this order): "
            "copy the lines as they are, '...' for what is left out"
        )


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_command_lines_exist(page: Page) -> None:
    targets = make_targets(REPO / "Makefile")
    problems: list[str] = []
    for where, command, complete in _page_commands(page):
        known = _program_words(command.words)
        if known is None:
            continue
        program, rest = known
        if program == "durable-tasks" and (problem := check_command(rest, complete=complete)):
            problems.append(f"{where}: {problem}")
        elif program == "make":
            missing = [w for w in rest if re.fullmatch(r"[a-z][\w.-]*", w) and w not in targets]
            problems += [f"{where}: the Makefile has no target {w!r}" for w in missing]
        elif program.startswith("module:"):
            module = program.removeprefix("module:")
            base = REPO / module.replace(".", "/")
            top = REPO / module.split(".")[0]
            if top.is_dir() and not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{where}: python -m {module}: no such module in the repository")
    assert not problems, "\n".join(problems)


def _help_paths() -> list[tuple[str, ...]]:
    """Every durable-tasks command the docs name, as the path of words before its arguments."""
    paths: set[tuple[str, ...]] = {()}
    for page in PAGES:
        for _, command, _ in _page_commands(page):
            known = _program_words(command.words)
            if known and known[0] == "durable-tasks" and check_command(known[1], complete=False) is None:
                words = [w for w in known[1] if re.fullmatch(r"[a-z][a-z-]*", w)]
                paths.add(tuple(words[:2]))
    return sorted(paths)


@pytest.mark.parametrize("path", _help_paths(), ids=lambda p: " ".join(("durable-tasks", *p)))
def test_named_commands_answer_help(path: tuple[str, ...]) -> None:
    # The first one or two lower-case words are the command path (or an argument, whose --help
    # is the command's own): what matters is that the command loads and prints its help.
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_links_point_into_the_repository(page: Page) -> None:
    problems: list[str] = []
    headings = {p.path: slugs(p.headings) for p in PAGES}
    for link in page.links:
        target, _, anchor = link.target.partition("#")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        where = f"{link.path.as_posix()}:{link.line}"
        resolved = (REPO / page.path.parent / target).resolve() if target else REPO / page.path
        if not resolved.is_relative_to(REPO):
            problems.append(f"{where}: {link.target} points outside the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where}: {link.target} does not exist")
            continue
        relative = resolved.relative_to(REPO)
        ignored = subprocess.run(["git", "check-ignore", "-q", str(relative)], cwd=REPO, check=False)
        if ignored.returncode == 0:
            problems.append(f"{where}: {link.target} is ignored by git (a fresh clone lacks it)")
        if anchor and relative.suffix == ".md" and anchor not in headings.get(relative, set()):
            problems.append(f"{where}: {relative.as_posix()} has no heading #{anchor}")
    assert not problems, "\n".join(problems)


def test_the_api_reference_shows_every_public_name() -> None:
    reference = (REPO / "docs" / "reference" / "api.md").read_text()
    shown = set(re.findall(r"^::: durable_tasks\.(\w+)$", reference, re.MULTILINE))
    missing = sorted(set(durable_tasks.__all__) - shown)
    assert not missing, f"docs/reference/api.md lacks ::: durable_tasks.NAME for {missing}"
