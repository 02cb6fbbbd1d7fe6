"""Command lines in the docs, checked against what exists: ``durable-tasks`` against the real
CLI parser (Typer's click objects, introspected, never a copy of the command list), ``make``
against the Makefile's targets, ``python -m`` against the repository's modules.

Docs name placeholders in upper case (``APP``, ``ID``) and optional parts in brackets
(``[--batch 1000]``): brackets are dropped and the words inside are checked like the rest.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main

from durable_tasks.cli import cli

__all__ = ["Command", "check_command", "make_targets", "shell_commands"]

_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    """One simple command: its words, environment assignments removed."""

    words: tuple[str, ...]

    @property
    def text(self) -> str:
        """The command as a shell line."""
        return shlex.join(self.words)


def shell_commands(script: str, *, prompts: bool = False) -> list[Command]:
    """Split a shell script (or a ``console`` transcript when ``prompts``: only ``$ `` lines are
    commands) into simple commands, on ``&&``, ``||``, ``;``, ``|`` and ``&``."""
    lines = script.splitlines()
    if prompts:
        lines = [line.lstrip()[2:] for line in lines if line.lstrip().startswith("$ ")]
    joined = "\n".join(lines).replace("\\\n", " ")
    commands: list[Command] = []
    pending = ""
    for line in joined.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = _words(pending)
        except ValueError:  # a quote closes on a later line
            continue
        pending = ""
        current: list[str] = []
        for word in words:
            if word in _OPERATORS:
                commands.append(Command(tuple(current)))
                current = []
            elif current or not _ASSIGNMENT.match(word):
                current.append(word)
        commands.append(Command(tuple(current)))
    if pending:
        raise ValueError(f"unclosed quote in {pending!r}")
    return [c for c in commands if c.words]


def _words(line: str) -> list[str]:
    # Redirections go first: '<' and '>' also write placeholders such as <run_id>.
    line = re.sub(r"(?:^|\s)(?:\d?>&\d|\d?(?:>>?|<)\s*[^\s<>|;&]+)(?=\s|$)", " ", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars="();|&")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _strip_placeholders(words: tuple[str, ...]) -> list[str]:
    stripped = (w.replace("[", "").replace("]", "") for w in words)
    return [w for w in stripped if w and w not in ("...", "…")]


def _names(params: list[Any]) -> dict[str, Any]:
    return {name: p for p in params if p.param_type_name == "option" for name in (*p.opts, *p.secondary_opts)}


def check_command(words: tuple[str, ...], *, complete: bool = True) -> str | None:
    """Check ``durable-tasks ...`` (``words`` without the program): the command path exists,
    every option exists on its command, positionals fit its arguments, and (when ``complete``:
    a command line, not a command named in prose) required ones are given.
    Returns what is wrong, or None."""
    cmd: Any = typer.main.get_command(cli)
    path = ["durable-tasks"]
    args = _strip_placeholders(words)
    while hasattr(cmd, "commands"):
        if not args or args[0] in ("--help", "-h"):
            return None
        if re.fullmatch(r"<[^>]*>", args[0]):  # <command>: a placeholder, nothing to check
            return None
        if args[0].startswith("-"):
            if args[0].split("=")[0] not in _names(cmd.params):
                return f"`{' '.join(path)}` has no option {args[0]}"
            args = args[1:]
            continue
        sub = cmd.commands.get(args[0])
        if sub is None:
            known = ", ".join(sorted(cmd.commands))
            return f"`{' '.join(path)}` has no command {args[0]!r} (it has: {known})"
        cmd, path, args = sub, [*path, args[0]], args[1:]
    return _check_leaf(cmd, " ".join(path), args, complete)


def _check_leaf(cmd: Any, name: str, args: list[str], complete: bool) -> str | None:
    options = _names(cmd.params)
    given: set[str] = set()
    positionals: list[str] = []
    it = iter(args)
    for word in it:
        if word == "--help":
            return None
        if word.startswith("-") and len(word) > 1:
            option = options.get(word.split("=")[0])
            if option is None:
                known = ", ".join(sorted(options)) or "none"
                return f"`{name}` has no option {word.split('=')[0]} (its options: {known})"
            given.add(option.name)
            if not option.is_flag and not option.count and "=" not in word:
                next(it, None)
        else:
            positionals.append(word)
    arguments = [p for p in cmd.params if p.param_type_name == "argument"]
    if "app_option" in given:  # --app names the App: APP is not among the positionals
        arguments = [a for a in arguments if a.name != "app"]
    if not any(a.nargs == -1 for a in arguments) and len(positionals) > len(arguments):
        names = " ".join(_metavar(a) for a in arguments) or "no arguments"
        return f"`{name}` takes {names}; the docs pass {' '.join(positionals)}"
    if not complete:
        return None
    # APP may come from DT_APP as well as from --app: a line may leave it out.
    required = [a for a in arguments if _required(a) and a.name != "app"]
    if len(positionals) < len(required):
        return f"`{name}` needs {' '.join(_metavar(a) for a in required)}; the docs pass {positionals or 'none'}"
    for option in cmd.params:
        if option.param_type_name == "option" and option.required and not option.envvar and option.name not in given:
            return f"`{name}` needs {option.opts[0]}"
    return None


def _metavar(argument: Any) -> str:
    return str(argument.metavar or argument.name.upper())


def _required(argument: Any) -> bool:
    """Whether a line must give this argument. The CLI declares its positionals optional (the
    App may come from --app, shifting the others), so its metavar says: ``TASK_ID`` is
    required, ``[APP]`` and ``TASK_ID...`` are not."""
    if argument.required:
        return not argument.envvar
    metavar = argument.metavar or ""
    return bool(metavar) and not metavar.startswith("[") and argument.nargs == 1


def make_targets(makefile: Path) -> set[str]:
    """The targets a Makefile defines (rules, not variable assignments)."""
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.%/ -]+):(?!=)", line)
        if match and not line.startswith("\t"):
            targets.update(match.group(1).split())
    return targets
