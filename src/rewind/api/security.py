"""Cross-site request refusal for the API server (pure: headers in, a reason out).

A server on 127.0.0.1 without a token is reachable by any page the user's browser opens: a
``<form method=post>`` or a ``fetch(..., {mode: "no-cors"})`` on ``http://evil.example`` may
POST to it, and although that page cannot read the answer, the request itself would start a run
or a replay. Browsers say where such a request comes from (``Origin``, else ``Referer``, and
``Sec-Fetch-Site`` in secure contexts, which loopback is), and a page cannot forge those headers,
so a state-changing request whose stated origin is not the server's own is refused before any
route runs. Requests that state no origin at all (curl, the CLI's client, scripts) are not
browser requests and pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["STATE_CHANGING_METHODS", "bearer_token", "cross_site_reason", "origin_of"]

STATE_CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods that may change state; GET/HEAD/OPTIONS only read (a cross-site page cannot read
the answer: the server sends no CORS headers)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}
_REFUSED_FETCH_SITES = ("cross-site", "same-site")
"""``same-site`` is refused too: another port of localhost (a different dev server) is the same
site but not the same origin."""

Origin = tuple[str, str, int]


def origin_of(url: str) -> Origin | None:
    """The (scheme, host, port) origin of an absolute http(s) URL; the port defaults by scheme.

    Args:
        url: ``http://127.0.0.1:8765``, ``https://[::1]/page?q=1`` (an ``Origin`` value or a
            ``Referer`` URL).
    Returns:
        ``("http", "127.0.0.1", 8765)``, host lowercased and without IPv6 brackets; None for
        anything that is not an absolute http(s) URL (``null``, ``file://…``, garbage).
    """
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def cross_site_reason(method: str, scheme: str, headers: Mapping[str, str]) -> str | None:
    """Why a request must be refused as cross-site, or None when it may proceed.

    Args:
        method: the HTTP method; only :data:`STATE_CHANGING_METHODS` are ever refused.
        scheme: the scheme the request was served over (``http``/``https``).
        headers: the request's headers, keys lowercase (``host``, ``origin``, ``referer``,
            ``sec-fetch-site``).
    Returns:
        None, or one line naming the header that shows another origin. Refused: a
        ``Sec-Fetch-Site`` of ``cross-site``/``same-site``; an ``Origin`` (or, without one, a
        ``Referer``) whose scheme, host and port differ from the server's own as served
        (``scheme://Host``); an opaque ``Origin: null`` unless ``Sec-Fetch-Site`` is
        ``same-origin`` (a same-origin page with a ``no-referrer`` policy sends ``null``).
    """
    if method.upper() not in STATE_CHANGING_METHODS:
        return None
    fetch_site = headers.get("sec-fetch-site", "").strip().lower()
    if fetch_site in _REFUSED_FETCH_SITES:
        return f"the browser marks this request Sec-Fetch-Site: {fetch_site}"
    origin = headers.get("origin")
    source = "Origin"
    if origin is None:
        origin, source = headers.get("referer"), "Referer"
        if origin is None:
            return None
    if source == "Origin" and origin.strip() == "null" and fetch_site == "same-origin":
        return None
    own = origin_of(f"{scheme}://{headers.get('host', '')}")
    theirs = origin_of(origin)
    if own is None or theirs != own:
        shown = origin if len(origin) <= 100 else origin[:100] + "…"
        return f"{source} {shown!r} is not this server's origin"
    return None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when there is none.

    The scheme is matched case-insensitively (RFC 9110 §11.1: ``bearer`` and ``BEARER`` are
    ``Bearer``); the token is taken as sent, without the surrounding whitespace.

    Args:
        authorization: the header's value (None: no header).
    Returns:
        ``"abc"`` for ``"bearer abc"``; None for a missing header, another scheme (``Basic``)
        or an empty token.
    """
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
