"""Migration steps as shipped: one SQL file per step and backend, read from the package.

A file ``<backend>/NNNN_<name>.sql`` is step NNNN. Its header comments may say:

``-- phase: post-deploy``
    the step contracts the schema (drops or tightens what the previous release still uses):
    apply it once no process of the previous release runs. The default, ``pre-deploy``, is a
    step that older code survives (it adds), applied before the new code starts.
``-- adopted: run``
    when tables made before versioning are adopted at this step's version or a later one, the
    step runs anyway (it makes what a table comparison cannot see, e.g. a stored procedure, and
    can run twice); the default, ``record``, only records it.
``-- transaction: none``
    the statements run one by one outside a transaction (``CREATE INDEX CONCURRENTLY``); the
    default runs the whole step in one transaction with its version row.

Statements end with ``;``. The splitter knows quotes, comments, PostgreSQL's dollar-quoted
bodies and the mysql client's ``DELIMITER`` lines, so a function or procedure body keeps its own
semicolons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib.resources import files

__all__ = ["BACKENDS", "Phase", "Step", "load_steps", "split_statements"]

#: Backend name (a SQLAlchemy dialect name) -> the package folder of its steps.
BACKENDS = {"postgresql": "postgres", "sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql"}

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_DELIMITER = re.compile(r"DELIMITER[ \t]+(\S+)[ \t]*(?:\n|$)", re.IGNORECASE)
_HEADER = re.compile(r"^--\s*(phase|transaction|adopted):\s*(\S+)\s*$", re.MULTILINE)


class Phase(StrEnum):
    """When a step runs relative to the deploy of the code that ships it."""

    PRE_DEPLOY = "pre-deploy"
    POST_DEPLOY = "post-deploy"


@dataclass(frozen=True, slots=True)
class Step:
    """One numbered schema change for one backend."""

    version: int
    name: str
    phase: Phase
    transactional: bool
    statements: tuple[str, ...]
    source: str
    run_when_adopted: bool = False

    @property
    def label(self) -> str:
        """``0002_dt_submit``: how the step is named in output."""
        return f"{self.version:04d}_{self.name}"


def split_statements(text: str) -> list[str]:
    """Split SQL text on ``;`` (or the delimiter a ``DELIMITER`` line sets) outside quotes,
    comments and dollar-quoted bodies; statements that hold only comments are dropped."""
    out: list[str] = []
    start = i = 0
    n = len(text)
    delimiter = ";"
    while i < n:
        c = text[i]
        line_start = i == 0 or text[i - 1] == "\n"
        if line_start and (directive := _DELIMITER.match(text, i)):
            out.append(text[start:i])
            delimiter = directive.group(1)
            i = start = directive.end()
        elif c == "-" and text.startswith("--", i):
            i = _end_of(text, "\n", i)
        elif c == "/" and text.startswith("/*", i):
            i = _end_of(text, "*/", i + 2)
        elif c in "'\"":
            i = _end_of(text, c, i + 1)
        elif c == "$" and (tag := re.match(r"\$(\w*)\$", text[i:])):
            i = _end_of(text, tag.group(0), i + len(tag.group(0)))
        elif text.startswith(delimiter, i):
            out.append(text[start:i])
            i += len(delimiter)
            start = i
        else:
            i += 1
    out.append(text[start:])
    return [_without_leading_comments(s) for s in out if _has_code(s)]


def _end_of(text: str, closer: str, i: int) -> int:
    found = text.find(closer, i)
    return len(text) if found < 0 else found + len(closer)


def _without_leading_comments(statement: str) -> str:
    lines = statement.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines).strip()


def _has_code(statement: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in statement.splitlines())


def _parse(version: int, name: str, source: str) -> Step:
    header = {key: value for key, value in _HEADER.findall(source)}
    transaction = header.get("transaction", "yes")
    if transaction not in ("yes", "none"):
        raise ValueError(f"migration {version:04d}_{name}: transaction must be 'yes' or 'none', not {transaction!r}")
    return Step(
        version=version,
        name=name,
        phase=Phase(header.get("phase", Phase.PRE_DEPLOY)),
        transactional=transaction == "yes",
        statements=tuple(split_statements(source)),
        source=source,
        run_when_adopted=header.get("adopted", "record") == "run",
    )


@cache
def load_steps(backend: str) -> tuple[Step, ...]:
    """Every step shipped for ``backend`` (a dialect name), numbered 1..N without gaps."""
    folder = BACKENDS.get(backend)
    if folder is None:
        raise KeyError(backend)
    found: list[Step] = []
    for entry in files(__package__).joinpath(folder).iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(_parse(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda s: s.version)
    if [s.version for s in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"{folder} migrations must be numbered 1..N without gaps: {[s.label for s in found]}")
    return tuple(found)
