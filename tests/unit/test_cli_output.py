"""Read commands' tables: drawn on a terminal wide enough, plain columns otherwise, never cut."""

from __future__ import annotations

import io

from rich.console import Console

from durable_tasks.cli.output import Grid

HEADERS = ["queue", "outbox_backlog", "outbox_oldest_age_s", "pel_size", "queue_delay_s", "failed", "dead"]


def grid() -> Grid:
    g = Grid(HEADERS, title="durable_tasks · namespace shop", numeric=frozenset(HEADERS[1:]))
    g.add("email", 12, "0.250", 3, "1.500", 1, "[red]10,000+[/]")
    return g


def printed(width: int, *, terminal: bool) -> str:
    out = io.StringIO()
    grid().print(Console(file=out, width=width, force_terminal=terminal, color_system=None))
    return out.getvalue()


def test_piped_output_is_plain_columns_with_every_header_whole_at_80_columns() -> None:
    text = printed(80, terminal=False)
    lines = text.splitlines()
    assert lines[0] == "durable_tasks · namespace shop"
    assert lines[1].split() == HEADERS
    assert lines[2].split() == ["email", "12", "0.250", "3", "1.500", "1", "10,000+"]  # markup stripped
    assert "…" not in text


def test_a_narrow_terminal_gets_plain_columns_too() -> None:
    text = printed(60, terminal=True)
    assert text.splitlines()[1].split() == HEADERS
    assert "┃" not in text


def test_a_wide_terminal_gets_a_table() -> None:
    text = printed(200, terminal=True)
    assert "┃" in text
    assert all(header in text for header in HEADERS)
    assert "…" not in text


def test_numbers_align_right_in_plain_columns() -> None:
    header, row = grid().plain()[1:3]
    assert header.index("failed") + len("failed") == row.index(" 1 ") + 2
