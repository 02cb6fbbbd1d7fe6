"""Connection URLs as they may be shown: passwords masked, whatever the scheme.

Every message, log line, span attribute and table that names a database or Redis URL goes
through :func:`safe_url`; the URL with its password is only ever handed to a driver.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

__all__ = ["MASK", "safe_url"]

#: What a password is replaced with.
MASK = "***"

#: Query parameters that carry a secret (redis-py and libpq read ``password`` from the query).
_SECRET_PARAMS = frozenset({"password", "passwd", "pass", "sslpassword"})

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<netloc>[^/?#]*)(?P<rest>.*)$", re.DOTALL)


def safe_url(url: str) -> str:
    """``url`` with the password of its user info, and any password query parameter,
    replaced by ``***``. Multi-host netlocs (``redis://:pw@h1:1,h2:2/0``) and URLs SQLAlchemy
    or redis-py would not parse are masked too: text that is not a URL is returned as it is."""
    found = _URL.match(url)
    if found is None:
        return url
    netloc = found["netloc"]
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:{MASK}@{hosts}"
    rest = found["rest"]
    path, question, query = rest.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() in _SECRET_PARAMS for key, _ in pairs):
            masked = [(key, MASK if key.lower() in _SECRET_PARAMS else value) for key, value in pairs]
            query = urlencode(masked, safe="/*:,")
        rest = f"{path}?{query}{hash_}{fragment}"
    return f"{found['scheme']}{netloc}{rest}"
