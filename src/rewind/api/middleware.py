"""The guard every request passes before a route: the Host check (DNS rebinding), the
cross-site check of state-changing requests, the body-size limit, the bearer token (or a user's
token, :mod:`rewind.store.users`) — and the security headers on every answer, refusals and
errors included."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from rewind.api.access import OPEN, SERVER_TOKEN, Principal, acting_as
from rewind.api.errors import error_response as _error
from rewind.api.security import bearer_token, cross_site_reason
from rewind.store import Store
from rewind.store.users import authenticate, has_users, teammates

__all__ = [
    "CSP",
    "LOOPBACK_HOSTS",
    "MAX_REQUEST_BYTES",
    "REFERRER_POLICY",
    "install_security",
    "is_loopback",
]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)

REFERRER_POLICY = "same-origin"
"""Other sites get no Referer (no run id leaves the UI). Not ``no-referrer``: under it the Fetch
standard sends ``Origin: null`` even on a same-origin POST, which the cross-site check
(:mod:`rewind.api.security`) cannot tell from a sandboxed page's."""


_log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """True for a loopback bind address or host name."""
    h = host.strip().strip("[]").lower()
    return h in LOOPBACK_HOSTS or h.startswith("127.")


def _host_name(header: str) -> str:
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _protected(path: str) -> bool:
    """API routes and the schema need the token; the static UI shell (no data) does not."""
    return path.startswith("/api") or path in ("/openapi.json",)


MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Largest request body (bytes) a state-changing API route reads; the OTLP receiver has its
own, larger limit (``rewind.tracing.otel.MAX_OTLP_BYTES``) and reads its body in a stream."""

_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _body_refusal(request: Request) -> Response | None:
    """413 for a declared body above :data:`MAX_REQUEST_BYTES`, 411 for a chunked body with no
    declared length (it would be read whole before any check), else None: refused before the
    body is read."""
    if request.method not in _STATE_CHANGING or "/otlp/" in request.url.path:
        return None
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > MAX_REQUEST_BYTES:
        return _error(
            413,
            "PayloadTooLarge",
            f"the request body is {int(declared)} bytes; at most {MAX_REQUEST_BYTES} are read",
            "send a smaller body",
        )
    if not declared and "chunked" in request.headers.get("transfer-encoding", "").lower():
        return _error(
            411,
            "LengthRequired",
            "a chunked request body without Content-Length is not read",
            "send the body with a Content-Length header",
        )
    return None


_ADMIN_ONLY = ("/api/traces", "/api/otlp/", "/api/tracing/")
"""With users, the trace service is an admin's: traces are not filtered by owner yet."""
_USERS_RECHECK_S = 1.0
"""Seconds between two checks of a store without users for the first user (once one exists,
every API request needs a token until the server stops)."""


def install_security(
    app: FastAPI,
    token: str | None,
    allowed_hosts: Sequence[str] | None,
    store: Store | None = None,
    *,
    require_auth: bool = False,
) -> Callable[[], bool]:
    """Install the guard middleware; returns ``auth_on()``: whether API requests need a token
    now (a server token, ``require_auth``, or users in ``store``)."""
    server_token = token.encode() if token else None
    hosts = {h.strip("[]").lower() for h in allowed_hosts} if allowed_hosts else None
    users_state = {"on": require_auth or server_token is not None, "checked": 0.0}
    users_lock = threading.Lock()

    def auth_on() -> bool:
        if users_state["on"] or store is None:
            return bool(users_state["on"])
        with users_lock:
            now = time.monotonic()
            if now - users_state["checked"] >= _USERS_RECHECK_S:
                users_state["checked"] = now
                users_state["on"] = has_users(store)
        return bool(users_state["on"])

    def principal_of(request: Request) -> Principal | None:
        """The requester of an API request, or None when it must be refused with 401."""
        if not auth_on():
            return OPEN
        given = bearer_token(request.headers.get("authorization"))
        if given is None:
            return None
        if server_token is not None and hmac.compare_digest(given.encode(), server_token):
            return SERVER_TOKEN
        if store is None:
            return None
        user = authenticate(store, given)
        return None if user is None else Principal.of(user, teammates(store, user))

    def refusal(request: Request) -> Response | None:
        """The answer for a request refused before any route runs, else None."""
        if hosts is not None:
            name = _host_name(request.headers.get("host", "")).lower()
            if name not in hosts:
                # DNS rebinding: a page on another origin resolving its name to 127.0.0.1.
                return _error(
                    421, "MisdirectedRequest", f"host {name!r} is not served here", "use the URL"
                )
        reason = cross_site_reason(request.method, request.url.scheme, request.headers)
        if reason is not None:
            # Checked before the token: a token-less loopback server is the one exposed.
            return _error(
                403,
                "CrossSiteRequest",
                f"refused a {request.method} from another site: {reason}",
                "open the UI from this server's own URL, or send the request without a browser "
                "(no Origin/Referer header)",
            )
        return _body_refusal(request)

    def unauthorized(request: Request) -> Response:
        sent = bearer_token(request.headers.get("authorization")) is not None
        response = _error(
            401,
            "Unauthorized",
            # a token that was sent and refused is not a missing one: say which
            "the bearer token sent was not accepted (mistyped, revoked or rotated)"
            if sent
            else "this server needs a bearer token",
            "send 'Authorization: Bearer <token>' (a token from `rewind user add`, or the one "
            "given to rewind serve --token)",
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    def known_open() -> bool:
        """True while auth is off and the store was checked for users less than a second ago:
        the request is served as :data:`OPEN` without a trip to the thread pool."""
        return not users_state["on"] and (
            time.monotonic() - users_state["checked"] < _USERS_RECHECK_S
        )

    async def answer(request: Request, call_next: Any) -> Response:
        if not _protected(request.url.path):
            return await call_next(request)  # the static UI shell: no data
        if known_open():
            principal: Principal | None = OPEN
        else:
            principal = await run_in_threadpool(principal_of, request)
        if principal is None:
            return unauthorized(request)
        if not principal.admin and request.url.path.startswith(_ADMIN_ONLY):
            return _error(
                403,
                "Forbidden",
                "the trace service needs an admin token on a server with users",
                "ask an admin, or use a token of a user added with `rewind user add NAME --admin`",
            )
        with acting_as(principal):
            response: Response = await call_next(request)
        return response

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        response = refusal(request)
        if response is None:
            try:
                response = await answer(request, call_next)
            except Exception as exc:  # a bug: answer in the envelope, never a bare text 500
                _log.exception("unhandled error on %s %s", request.method, request.url.path)
                response = _error(
                    500,
                    "InternalError",
                    f"the server failed on this request ({type(exc).__name__})",
                    "see the server's log for the traceback, and report it as a bug",
                )
        # Every answer, refusals and errors included, carries the same headers.
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", REFERRER_POLICY)
        response.headers.setdefault("X-Frame-Options", "DENY")
        if _protected(request.url.path):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    return auth_on
