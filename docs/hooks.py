"""Build-time parts of the site (mkdocs hooks): the README as the home page, the command line
reference generated from the Typer app (so neither can drift from its source), and the
repository files the pages link to outside docs/ (benchmark results and plots, the examples'
and benchmarks' READMEs), published at their repository paths."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Files outside docs/ that pages link to, published at the same path in the site.
OUTSIDE = ("benchmarks/README.md", "benchmarks/results/latest*", "examples/*/README.md", "tests/docs/README.md")
_LINK = re.compile(r"(\]\()([^)\s#]+)")


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")  # its links are rewritten below


def _cli() -> str:
    import typer.main
    from typer.cli import get_docs_for_click
    from typer.models import Context

    from durable_tasks.cli import cli

    command = typer.main.get_command(cli)
    body = get_docs_for_click(obj=command, ctx=Context(command), name="durable-tasks", title="Command line")
    note = "Generated from the `durable-tasks` command's own help when the site is built.\n\n"
    return re.sub(r"^(# .*\n)", lambda m: m.group(1) + "\n" + note, body, count=1)


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and the linked repository files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "index.md", content=_readme()))
    files.append(File.generated(config, "reference/cli.md", content=_cli()))
    for pattern in OUTSIDE:
        for path in sorted(ROOT.glob(pattern)):
            uri = path.relative_to(ROOT).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Make the pages' repository-relative links work in the site, where docs/X is X and the
    published files outside docs/ keep their repository paths."""
    uri = page.file.src_uri
    site_dir = posixpath.dirname(uri)
    if uri == "index.md":  # the README, at the repository's root
        repo_dir = ""
    elif page.file.abs_src_path and not Path(page.file.abs_src_path).is_relative_to(ROOT / "docs"):
        repo_dir = site_dir  # published at its repository path
    else:
        repo_dir = posixpath.join("docs", site_dir)

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        repo_path = posixpath.normpath(posixpath.join(repo_dir, target))
        site_path = repo_path.removeprefix("docs/")
        if files.get_file_from_path(site_path) is None:
            return match.group(0)
        return match.group(1) + posixpath.relpath(site_path, site_dir or ".")

    return _LINK.sub(rewrite, markdown)


try:
    from griffe import Extension as _GriffeExtension
except ImportError:  # the hooks module is imported by mkdocs, which installs griffe with mkdocstrings
    _GriffeExtension = object  # type: ignore[assignment,misc]

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`~?\.*([^`]+)`")


class SphinxRoles(_GriffeExtension):  # type: ignore[misc]
    """The docstrings name things with Sphinx roles (``:class:`App```); the reference shows them
    as code, which is what they mean."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """Rewrite the roles of one object's docstring."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
