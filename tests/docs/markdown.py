"""What the docs tests read from a Markdown page: fenced blocks with their markers, inline code,
links and headings (parsed with markdown-it, the CommonMark parser rich already depends on).

A marker is an HTML comment ``<!-- docs-test: ... -->`` right before a fence; the grammar is in
tests/docs/README.md. Everything here is pure: it reads text and returns records.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = [
    "SHELL_KINDS",
    "Block",
    "InlineCode",
    "Link",
    "MarkerError",
    "Page",
    "parse_page",
    "slugs",
]

SHELL_KINDS = frozenset({"bash", "console", "sh", "shell"})

_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<body>.*?)\s*-->", re.DOTALL)
_PARSER = MarkdownIt("commonmark").enable("table")


class MarkerError(ValueError):
    """A ``docs-test`` marker the harness does not understand, or one in the wrong place."""


@dataclass
class Block:
    """One fenced code block and what its markers say about it."""

    path: Path
    line: int  # 1-based line of the opening fence
    kind: str  # the fence's info string, first word ("" when the fence has none)
    code: str
    skip: str | None = None  # the reason given by "skip because ..."
    fragment: bool = False  # "fragment of the block above"
    excerpt_of: str | None = None  # "excerpt of PATH"
    save_as: str | None = None  # "save as NAME"
    run: bool = False  # "run" (shell blocks)
    timeout: float | None = None  # "timeout SECONDS"
    output: Block | None = field(default=None, repr=False)  # the ```output block after it

    @property
    def where(self) -> str:
        """``path:line`` for messages and test ids."""
        return f"{self.path.as_posix()}:{self.line}"


@dataclass(frozen=True)
class InlineCode:
    """Inline code in prose (tables included)."""

    path: Path
    line: int
    text: str


@dataclass(frozen=True)
class Link:
    """A link or image target."""

    path: Path
    line: int
    target: str


@dataclass
class Page:
    """Everything the tests check on one Markdown file."""

    path: Path
    blocks: list[Block]
    inline_code: list[InlineCode]
    links: list[Link]
    headings: list[str]


def _apply_marker(block: Block, body: str) -> None:
    if body == "skip because" or body.startswith("skip because "):
        reason = body.removeprefix("skip because").strip()
        if len(reason) < 10:
            raise MarkerError(f"{block.where}: say why the block is skipped: {body!r}")
        block.skip = reason
    elif body == "fragment of the block above":
        block.fragment = True
    elif body.startswith("excerpt of "):
        block.excerpt_of = body.removeprefix("excerpt of ").strip()
    elif body.startswith("save as "):
        block.save_as = body.removeprefix("save as ").strip()
    elif body == "run":
        block.run = True
    elif re.fullmatch(r"timeout \d+(\.\d+)?", body):
        block.timeout = float(body.split()[1])
    else:
        raise MarkerError(f"{block.where}: unknown docs-test marker {body!r} (see tests/docs/README.md)")


def _inline(path: Path, token: Token, code: list[InlineCode], links: list[Link]) -> None:
    line = token.map[0] + 1 if token.map else 0
    for child in token.children or []:
        if child.type == "code_inline":
            code.append(InlineCode(path, line, child.content))
        elif child.type == "link_open":
            links.append(Link(path, line, str(child.attrs.get("href", ""))))
        elif child.type == "image":
            links.append(Link(path, line, str(child.attrs.get("src", ""))))


def parse_page(path: Path, text: str) -> Page:
    """Parse one page; ``path`` is how the page is named in messages (relative to the repo)."""
    blocks: list[Block] = []
    code: list[InlineCode] = []
    links: list[Link] = []
    headings: list[str] = []
    pending: list[str] = []  # marker bodies waiting for the next fence
    tokens = _PARSER.parse(text)
    for i, token in enumerate(tokens):
        if token.type == "html_block" and _MARKER.search(token.content):
            pending.extend(m.group("body") for m in _MARKER.finditer(token.content))
            continue
        if token.type == "fence":
            line = (token.map[0] + 1) if token.map else 0
            block = Block(path, line, token.info.split()[0] if token.info else "", token.content)
            for body in pending:
                _apply_marker(block, body)
            pending = []
            if block.kind == "output" and i > 0 and tokens[i - 1].type == "fence" and blocks[-1].output is None:
                blocks[-1].output = block
            blocks.append(block)
            continue
        if pending and token.type not in ("html_block",):
            line = (token.map[0] + 1) if token.map else 0
            raise MarkerError(f"{path.as_posix()}:{line}: a docs-test marker must come right before a fenced block")
        if token.type == "inline":
            _inline(path, token, code, links)
            if i > 0 and tokens[i - 1].type == "heading_open":
                headings.append(token.content)
    return Page(path, blocks, code, links, headings)


def slugs(headings: list[str]) -> set[str]:
    """The anchors GitHub gives these headings (lower case, punctuation dropped, spaces to
    hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for heading in headings:
        plain = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        slug = "".join(ch for ch in plain if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result
