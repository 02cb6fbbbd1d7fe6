"""How read commands print: a table on a terminal wide enough for it, plain aligned columns
otherwise (piped, in CI, or a narrow terminal), and JSON with ``--json``.

A rich table on a console narrower than its columns truncates headers and cells ("outbox_…");
plain text is never cut: its lines are as long as their content, so ``grep``, ``awk`` and a
reader of a CI log see every header and value. ``--json`` prints one object (a ``show``) or
one object per line (a ``list``), for ``jq``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .base import console

__all__ = ["Grid", "print_json", "print_json_lines"]


def _default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    return str(value)


def print_json(value: Any) -> None:
    """``value`` as one JSON document (datetimes in ISO 8601, durations in seconds)."""
    typer.echo(json.dumps(value, default=_default, ensure_ascii=False))


def print_json_lines(values: Iterable[Any]) -> None:
    """One JSON object per line."""
    for value in values:
        print_json(value)


@dataclass(slots=True)
class Grid:
    """Rows under headers, printed as a table or as plain columns (see the module)."""

    headers: Sequence[str]
    title: str | None = None
    #: Headers of columns aligned right (numbers).
    numeric: frozenset[str] = frozenset()
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        """One row; markup in a cell is shown on a terminal and stripped in plain text."""
        self.rows.append(["" if c is None else str(c) for c in cells])

    def table(self) -> Table:
        """As a rich table."""
        table = Table(title=self.title)
        for header in self.headers:
            table.add_column(header, justify="right" if header in self.numeric else "left")
        for row in self.rows:
            table.add_row(*row)
        return table

    def plain(self) -> list[str]:
        """As plain lines: the title, the headers, then the rows, in aligned columns."""
        cells = [list(self.headers)] + [[Text.from_markup(c).plain for c in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        lines = [self.title] if self.title else []
        for row in cells:
            parts = [
                c.rjust(w) if h in self.numeric else c.ljust(w)
                for c, w, h in zip(row, widths, self.headers, strict=True)
            ]
            lines.append("  ".join(parts).rstrip())
        return lines

    def _width(self) -> int:
        """What the table needs to show every cell whole: each column as wide as its widest
        cell, plus padding (2) and a border (1) per column, and the last border."""
        cells = [list(self.headers)] + [[Text.from_markup(c).plain for c in row] for row in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.headers))]
        return sum(w + 3 for w in widths) + 1

    def print(self, out: Console | None = None) -> None:
        """A table when the console is a terminal wide enough for every header; plain otherwise."""
        out = out or console()
        if out.is_terminal and self._width() <= out.width:
            out.print(self.table())
            return
        for line in self.plain():
            out.print(line, markup=False, highlight=False, soft_wrap=True)
