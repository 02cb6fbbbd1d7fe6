"""What a failed attempt leaves behind for its operator: the exception's type, its message and
its traceback, bounded in size and with secrets masked.

An exception's text is written by whatever raised it: a driver's error names the URL it could
not reach, a DSN can carry ``password=…``. Every message and traceback the runtime stores or
logs goes through :func:`scrub`, which masks the password of any URL in the text (as
:func:`~durable_tasks.urls.safe_url` does for one URL) and the value of ``password=`` pairs.
A traceback keeps its END (the frame that raised and the exception line) when it is cut.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from .urls import MASK

__all__ = ["MAX_MESSAGE_CHARS", "MAX_TRACEBACK_CHARS", "Failure", "scrub", "storable"]

#: The longest error message stored (its start is kept).
MAX_MESSAGE_CHARS = 4000
#: The longest traceback stored (its end is kept: where the error was raised).
MAX_TRACEBACK_CHARS = 8192

# scheme://user:password@ -> scheme://user:***@ (the password may not hold '@', '/' or spaces).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s/@]+@")
# password=secret (a query parameter, a libpq DSN, a keyword argument's repr, a dict's repr).
# ("pass" only before "=": "first pass: 3 errors" is prose.)
_PASSWORD_PAIR = re.compile(
    r"(?P<key>\b(?:(?:password|passwd|sslpassword)['\"]?\s*[=:]|pass\s*=)\s*['\"]?)[^\s&'\",;)]+", re.IGNORECASE
)


def scrub(text: str) -> str:
    """``text`` with the passwords of URLs and of ``password=`` pairs replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _PASSWORD_PAIR.sub(lambda m: f"{m['key']}{MASK}", text)


def _cut_keeping_end(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"[{len(text) - limit} characters cut]\n"
    return marker + text[len(text) - limit + len(marker) :]


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt's exception as the runtime records and logs it."""

    #: The exception's class name (``ValueError``).
    error_type: str
    #: ``str(exc)``, scrubbed, at most :data:`MAX_MESSAGE_CHARS`.
    message: str
    #: The formatted traceback (chained causes included), scrubbed, at most
    #: :data:`MAX_TRACEBACK_CHARS` (its end kept).
    traceback: str
    #: True when the task's ``on_commit`` hook raised (the body had succeeded: its result was
    #: rolled back with the hook's writes), False when the body itself failed.
    in_hook: bool = False

    @property
    def recorded_message(self) -> str:
        """The message the task and attempt rows keep: a hook's failure says so, so that a
        FAILED task's error tells a bug in the hook from a failing task body."""
        return f"in the on_commit hook: {self.message}" if self.in_hook else self.message

    @classmethod
    def of(cls, exc: BaseException, *, in_hook: bool = False) -> Failure:
        """The record of ``exc``, raised by a task body or (``in_hook``) by its on_commit hook."""
        formatted = "".join(traceback.format_exception(exc))  # "<exception str() failed>" if it raises
        return cls(
            error_type=type(exc).__qualname__,
            message=storable(scrub(_message_of(exc)))[:MAX_MESSAGE_CHARS],
            traceback=_cut_keeping_end(storable(scrub(formatted)), MAX_TRACEBACK_CHARS),
            in_hook=in_hook,
        )


def _message_of(exc: BaseException) -> str:
    """``str(exc)``; an exception whose ``__str__`` raises is named by its type instead (its
    failure would otherwise go unrecorded, and the task redelivered until dead-lettered)."""
    try:
        return str(exc)
    except Exception as broken:
        return f"<{type(exc).__qualname__}: str() raised {type(broken).__name__}>"


def storable(text: str) -> str:
    """``text`` as every database stores it: a NUL byte (which PostgreSQL refuses in text) and a
    lone surrogate (which UTF-8 cannot hold: what ``surrogateescape`` makes of a judged
    program's output that is not UTF-8) written as backslash escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text
