"""Named SQL statements, kept as resources (``postgres.sql``): ``-- name: x`` starts one.

The hot paths on PostgreSQL run these through the driver (``exec_driver_sql``): one fixed
text per statement, batch values in arrays, so nothing is compiled per call and psycopg can
prepare each statement once per connection.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

__all__ = ["postgres"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a file of named statements into {name: statement} (comments and ``;`` dropped)."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";")
        if name in queries or not statement:
            raise ValueError(f"named statement {name!r} is duplicated or empty")
        queries[name] = statement
    return queries


@cache
def postgres() -> dict[str, str]:
    """The PostgreSQL statements by name."""
    return parse(files(__package__).joinpath("postgres.sql").read_text(encoding="utf-8"))
