"""Database URLs as they may be printed or stored: the password and password-like query keys
masked through SQLAlchemy's URL object (a regex for what it cannot parse). Pure Python."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

MASK = "***"
SECRET_QUERY_KEYS = ("password", "passwd", "sslpassword", "pwd")
_USERINFO = re.compile(r"(//[^/@:?#]*):[^@/?#]*@")
_KEYS = "|".join(SECRET_QUERY_KEYS)
_QUERY = re.compile(rf"(?i)([?&](?:{_KEYS})=)[^&#]*")


def _parse(url: str) -> Any:
    from sqlalchemy.engine import make_url

    return make_url(url)


def redact_url(url: str) -> str:
    """`url` with its password and secret query values replaced by ***, whatever its form
    (`//user:pw@host`, `//:pw@host`, `?password=pw`, `?sslpassword=pw`)."""
    try:
        u = _parse(url)
        if u.password is not None:
            u = u.set(password=MASK)
        query = {k: (MASK if k.lower() in SECRET_QUERY_KEYS else v) for k, v in u.query.items()}
        text = u.set(query=query).render_as_string(hide_password=False)
    except Exception:  # not an SQLAlchemy URL
        text = url
    # the regexes also catch what a URL object keeps in a form it does not parse
    return _QUERY.sub(rf"\g<1>{MASK}", _USERINFO.sub(rf"\g<1>:{MASK}@", text))


def url_secrets(url: str) -> list[str]:
    """The secret strings in `url` (raw and %-decoded), longest first, to scrub from messages."""
    found: set[str] = set()
    try:
        u = _parse(url)
        if u.password:
            found.add(str(u.password))
        for k, v in u.query.items():
            if k.lower() in SECRET_QUERY_KEYS:
                found.update([v] if isinstance(v, str) else list(v))
    except Exception:
        pass
    for m in re.finditer(r"//[^/@:?#]*:([^@/?#]+)@", url):
        found.add(m.group(1))
    for m in re.finditer(rf"(?i)[?&](?:{_KEYS})=([^&#]+)", url):
        found.add(m.group(1))
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message, say) with every secret of `url` replaced by ***."""
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return text
