"""What keeps the dashboard safe: HTTP Basic auth from the environment, CSRF tokens on every
action, the refusal to listen beyond loopback without authentication, and who did it.

CSRF is a signed double submit: the browser holds a random HttpOnly cookie, each page carries
the HMAC of that cookie under the dashboard's secret, and an action must send that token back
(form field or ``X-CSRF-Token`` header). A cross-site request (``Sec-Fetch-Site``) is refused too.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, Request, Response
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from ..errors import ConfigurationError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "PASSWORD_ENV",
    "USER_ENV",
    "BasicAuth",
    "Csrf",
    "check_bind",
    "is_loopback",
]

USER_ENV = "DT_WEB_USER"
PASSWORD_ENV = "DT_WEB_PASSWORD"
CSRF_COOKIE = "dt_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True, slots=True)
class BasicAuth:
    """One user and password for HTTP Basic auth (the password is never shown or logged)."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"BasicAuth(user={self.user!r}, password=***)"

    @classmethod
    def from_env(cls) -> BasicAuth | None:
        """From ``DT_WEB_USER`` and ``DT_WEB_PASSWORD``; None unless both are set."""
        user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
        return cls(user, password) if user and password else None

    def dependency(self) -> Callable[[Request], str]:
        """A FastAPI dependency that demands these credentials and returns the user."""
        basic = HTTPBasic(realm="durable_tasks", auto_error=False)

        async def require(request: Request) -> str:
            given: HTTPBasicCredentials | None = await basic(request)
            ok = given is not None and all(
                hmac.compare_digest(x.encode(), y.encode())
                for x, y in ((given.username, self.user), (given.password, self.password))
            )
            if not ok or given is None:
                raise HTTPException(401, "authentication required", headers={"WWW-Authenticate": "Basic"})
            request.state.dt_actor = given.username
            return given.username

        return require  # type: ignore[return-value]


class Csrf:
    """Issues and checks the dashboard's CSRF tokens."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def token(self, request: Request, response: Response | None = None) -> str:
        """The token for this browser; sets its cookie on ``response`` when it has none yet."""
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce:
            nonce = request.state.dt_csrf_nonce = getattr(request.state, "dt_csrf_nonce", None) or secrets.token_hex(16)
            if response is not None:
                response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict", path="/")
        return self._sign(nonce)

    def seal(self, text: str) -> str:
        """A signature of ``text`` (a notice carried in a redirect: shown only when it is ours)."""
        return self._sign("notice:" + text)

    def opened(self, text: str | None, seal: str | None) -> str | None:
        """``text`` if ``seal`` is its signature, else None: a link cannot put words on a page."""
        if not text or not seal or not hmac.compare_digest(seal, self.seal(text)):
            return None
        return text

    async def verify(self, request: Request) -> None:
        """Refuse (403) an action without this browser's token, or sent from another site."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPException(403, "cross-site request refused")
        nonce = request.cookies.get(CSRF_COOKIE)
        sent = request.headers.get(CSRF_HEADER)
        if sent is None:
            form = await request.form()
            value = form.get(CSRF_FIELD)
            sent = value if isinstance(value, str) else None
        if not nonce or not sent or not hmac.compare_digest(sent, self._sign(nonce)):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, authenticated: bool) -> None:
    """Refuse to listen beyond loopback when nobody has to log in."""
    if not is_loopback(host) and not authenticated:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host} without authentication: set {USER_ENV} and "
            f"{PASSWORD_ENV}, mount the router behind your own auth, or bind to 127.0.0.1"
        )
