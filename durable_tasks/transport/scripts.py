"""Lua scripts shipped as ``lua/*.lua`` resources, loaded once per client."""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["lua_source"]


@cache
def lua_source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
