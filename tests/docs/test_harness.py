"""The docs harness catches what it is for: a made-up command or option, a misplaced argument,
a marker it does not know, an output that differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .commands import check_command, make_targets, shell_commands
from .markdown import MarkerError, parse_page, slugs
from .pages import REPO, matches_output, programs


def words(line: str) -> tuple[str, ...]:
    (command,) = shell_commands(line)
    return command.words[1:]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("durable-tasks frobnicate APP", "has no command 'frobnicate'"),
        ("durable-tasks tasks frobnicate ID", "has no command 'frobnicate'"),
        ("durable-tasks status APP --colour", "has no option --colour"),
        ("durable-tasks dlq show QUEUE ENTRY EXTRA --app APP", "takes QUEUE ENTRY"),
        ("durable-tasks dlq show QUEUE", "needs QUEUE ENTRY"),
    ],
)
def test_a_command_the_cli_does_not_have_is_reported(line: str, problem: str) -> None:
    found = check_command(words(line))
    assert found is not None
    assert problem in found


@pytest.mark.parametrize(
    "line",
    [
        "durable-tasks --help",
        "durable-tasks status APP [--watch] [--interval 0.5]",
        "durable-tasks prune APP --older-than=24",
        "durable-tasks tasks show TASK_ID",  # the App may come from DT_APP
        "durable-tasks tasks show APP TASK_ID",
        "durable-tasks tasks show TASK_ID --app APP",
        "durable-tasks tasks rerun APP --state FAILED --yes",
        "DT_NAMESPACE=x durable-tasks run myproject.tasks:app",
    ],
)
def test_a_command_the_cli_has_passes(line: str) -> None:
    assert check_command(words(line)) is None


def test_prose_may_name_a_command_without_its_arguments() -> None:
    assert check_command(words("durable-tasks dlq show"), complete=False) is None
    assert check_command(words("durable-tasks dlq show"), complete=True) is not None


def test_shell_lines_split_into_commands() -> None:
    script = "make demo && DT_X=1 python -m tests.chaos --only a 2>&1 | tee log  # why\n$ not a prompt here"
    assert [c.words[0] for c in shell_commands(script)] == ["make", "python", "tee", "$"]
    transcript = "$ durable-tasks --help\nUsage: durable-tasks [OPTIONS]\n"
    assert [c.words for c in shell_commands(transcript, prompts=True)] == [("durable-tasks", "--help")]


def test_the_makefile_targets_are_read() -> None:
    targets = make_targets(REPO / "Makefile")
    assert {"test", "demo"} <= targets
    assert "BIN" not in targets


def test_markers_are_understood_or_refused() -> None:
    page = parse_page(
        Path("p.md"),
        "```python\nx = 1\n```\n\n<!-- docs-test: fragment of the block above -->\n```python\nprint(x)\n```\n"
        "```output\n1\n```\n",
    )
    (program,) = programs(page)[0]
    assert program.code == "x = 1\n\nprint(x)\n"
    assert program.last.output is not None
    assert program.last.output.code == "1\n"
    with pytest.raises(MarkerError, match="unknown docs-test marker"):
        parse_page(Path("p.md"), "<!-- docs-test: run twice -->\n```bash\nls\n```\n")
    with pytest.raises(MarkerError, match="say why"):
        parse_page(Path("p.md"), "<!-- docs-test: skip because -->\n```python\nx\n```\n")
    with pytest.raises(MarkerError, match="right before a fenced block"):
        parse_page(Path("p.md"), "<!-- docs-test: run -->\n\nSome prose.\n")


def test_output_matches_line_by_line_with_ellipsis() -> None:
    assert matches_output("a\n...\nd\n", "a\nb\nc\nd\n")
    assert matches_output("a\n...\nd\n", "a\nd")
    assert not matches_output("a\nd\n", "a\nb\nd\n")
    assert not matches_output("a (b)\n", "a b\n")


def test_anchors_follow_github() -> None:
    assert slugs(["What is NOT guaranteed", "Run `make bench`", "Run `make bench`"]) == {
        "what-is-not-guaranteed",
        "run-make-bench",
        "run-make-bench-1",
    }
