"""Lua scripts shipped as ``lua/*.lua`` resources, loaded once per client."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

__all__ = ["Script", "lua_source"]


@cache
def lua_source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


class Script:
    """A Lua script resource and its SHA1 (for EVALSHA)."""

    def __init__(self, name: str) -> None:
        self.source = lua_source(name)
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
