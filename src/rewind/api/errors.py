"""The API's error answers: every error is the JSON envelope of
:class:`~rewind.api.schemas.ErrorBody` with the status its type maps to."""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewind.api.context import UnknownJob
from rewind.api.manage import NotOwner
from rewind.errors import (
    EndpointUnavailable,
    ForkError,
    InvalidRequest,
    RewindError,
    RunBusy,
    StoreError,
    UnknownNode,
    UnknownRun,
)
from rewind.jobs import JobError
from rewind.jobs.queue import QueueUnavailable

__all__ = ["error_response", "install_error_handlers", "status_of"]

_STATUS = {
    UnknownRun: 404,
    UnknownJob: 404,
    UnknownNode: 404,
    InvalidRequest: 422,
    RunBusy: 409,
    ForkError: 409,
    EndpointUnavailable: 503,
    StoreError: 500,
    QueueUnavailable: 503,
    JobError: 422,
    NotOwner: 403,
}


def error_response(
    status: int, kind: str, message: str, hint: str = "", **extra: Any
) -> JSONResponse:
    body = {"error": kind, "message": message, "hint": hint, **extra}
    return JSONResponse(body, status_code=status)


def status_of(exc: RewindError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 400


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RewindError)
    async def rewind_error(_request: Request, exc: RewindError) -> JSONResponse:
        extra = {"field": exc.field}
        return error_response(status_of(exc), type(exc).__name__, exc.message, exc.hint, **extra)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        field = _loc_field(first.get("loc", ()))
        details = [
            {"field": _loc_field(e.get("loc", ())), "message": e.get("msg", "")} for e in errors
        ]
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        if first.get("type") == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", "")
            where = first.get("loc", ("body", "?"))[-1]
            field = "body"
            message = f"the request body is not valid JSON ({reason} at character {where})"
        return error_response(
            422,
            "InvalidRequest",
            message,
            "see /openapi.json for the request's schema",
            field=field or None,
            details=details,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _status_kind(exc.status_code)
        hint = {
            400: "see /openapi.json for the request's schema",
            404: "see /openapi.json for the API's routes",
            405: "see /openapi.json for the API's routes",
        }.get(exc.status_code, "")
        return error_response(exc.status_code, kind, str(exc.detail), hint)


def _status_kind(status: int) -> str:
    """``409`` → ``Conflict``, ``415`` → ``UnsupportedMediaType``: the error type of a plain HTTP
    error (one a route raises as ``HTTPException``, or Starlette's routing answers)."""
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return "HTTPError"


def _loc_field(loc: Sequence[Any]) -> str:
    """``("body", "override", "param", "value")`` → ``override.value`` (a discriminated union
    puts its tag in the location; the request field is what the client needs)."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path"):
        parts = parts[1:]
    if len(parts) >= 2 and parts[0] == "override" and parts[1] in ("param", "output"):
        parts = [parts[0], *parts[2:]]
    return ".".join(parts)
