"""The repository's Markdown pages and the units the docs tests run: programs (a python block,
with the fragments that continue it), shell blocks marked ``run``, and the processes to run them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .markdown import SHELL_KINDS, Block, MarkerError, Page, parse_page

__all__ = [
    "DEFAULT_TIMEOUT",
    "REPO",
    "Program",
    "kill_leftovers",
    "load_pages",
    "matches_output",
    "programs",
    "run_env",
]

REPO = Path(__file__).resolve().parents[2]
#: Seconds a block may run; a block that needs more says so with ``timeout N``.
DEFAULT_TIMEOUT = 90.0
_TEST_URLS = ("DT_TEST_DATABASE_URL", "DT_TEST_REDIS_URL", "DT_TEST_MYSQL_URL")


def _markdown_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every page on disk
        listed = [p.relative_to(REPO).as_posix() for p in REPO.rglob("*.md") if ".venv" not in p.parts]
    return sorted(Path(p) for p in listed if (REPO / p).exists())


def load_pages() -> tuple[list[Page], dict[Path, str]]:
    """Every Markdown page of the repository (tracked or new, not ignored), parsed; pages whose
    markers do not parse are returned apart with the error."""
    pages: list[Page] = []
    broken: dict[Path, str] = {}
    for path in _markdown_files():
        try:
            pages.append(parse_page(path, (REPO / path).read_text(encoding="utf-8")))
        except MarkerError as exc:
            broken[path] = str(exc)
    return pages, broken


@dataclass
class Program:
    """A python block run as one program: its own code, or a chain of fragments."""

    blocks: list[Block]

    @property
    def last(self) -> Block:
        """The block the program ends with (its output block, markers and timeout count)."""
        return self.blocks[-1]

    @property
    def code(self) -> str:
        """The program's source."""
        return "\n".join(b.code for b in self.blocks)

    @property
    def where(self) -> str:
        """Where the program starts and how many blocks make it."""
        first = self.blocks[0].where
        return first if len(self.blocks) == 1 else f"{first}+{len(self.blocks) - 1}"


def programs(page: Page) -> tuple[list[Program], list[str]]:
    """The python programs of a page, and what is wrong with its fragment markers."""
    result: list[Program] = []
    problems: list[str] = []
    for block in page.blocks:
        if block.kind != "python" or block.excerpt_of is not None:
            continue
        if block.fragment:
            if not result or result[-1].last.skip is not None:
                problems.append(f"{block.where}: 'fragment of the block above' has no runnable python block above it")
                continue
            result[-1].blocks.append(block)
        else:
            result.append(Program([block]))
    return [p for p in result if all(b.skip is None for b in p.blocks)], problems


def shell_runs(page: Page) -> list[Block]:
    """Shell blocks the page asks to run."""
    return [b for b in page.blocks if b.kind in SHELL_KINDS and b.run and b.skip is None]


def run_env() -> dict[str, str]:
    """The environment a block runs in: this one without the runtime's DT_* settings (so
    ``App()`` is the embedded default), the test servers' DT_TEST_* URLs kept for blocks that
    read them, this virtualenv's scripts first on PATH and the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_") or k in _TEST_URLS}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    return env


def missing_urls(code: str) -> list[str]:
    """The DT_TEST_* variables the code reads that this environment lacks."""
    return [name for name in _TEST_URLS if name in code and not os.environ.get(name)]


def kill_leftovers(directory: Path) -> list[str]:
    """Stop processes a block left behind (an embedded Valkey started with its own session),
    found by their command line or working directory inside the block's ``directory``;
    returns their command lines."""
    marker = str(directory.resolve())
    found: list[str] = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if marker in cmdline or cwd.startswith(marker):
            try:
                os.kill(int(proc.name), signal.SIGTERM)
                found.append(cmdline.strip())
            except ProcessLookupError:
                pass
    return found


def run_in(directory: Path, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``directory`` in its own session; on timeout the whole session is killed."""
    proc = subprocess.Popen(
        argv,
        cwd=directory,
        env=run_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise TimeoutError(f"still running after {timeout:g} s\nstdout:\n{out}\nstderr:\n{err}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def matches_output(expected: str, actual: str) -> bool:
    """``actual`` matches ``expected`` line by line (trailing spaces ignored); a line ``...``
    in ``expected`` stands for any number of lines."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip("\n").splitlines()]

    pattern = "\n".join(".*?" if line == "..." else re.escape(line) for line in lines(expected)).replace(
        "\n.*?\n", "(?:\n.*?)?\n"
    )
    return re.fullmatch(pattern, "\n".join(lines(actual)), re.DOTALL) is not None
