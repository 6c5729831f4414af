"""The JSON error envelope of the HTTP API and the OpenAPI ``responses=`` that declare it.

Every error the API answers — a :class:`~rewind.errors.RewindError` from a route, an invalid
request, a missing token, a refused cross-site request — has one shape, :class:`ErrorBody`. Each
route lists the error statuses it can answer with :func:`error_responses`, so the OpenAPI
document (and any client built from it) knows every status and its body; the conformance test
(``tests/test_api_conformance.py``) holds the served app to it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "ACCEPTED",
    "ERROR_DESCRIPTIONS",
    "FORK_ERRORS",
    "LOOKUP_ERRORS",
    "SERVER_ERRORS",
    "STATE_CHANGING_ERRORS",
    "ErrorBody",
    "FieldProblem",
    "RunAccepted",
    "error_responses",
    "response_header",
]


class FieldProblem(BaseModel):
    """One problem of an invalid request: the request field and what is wrong with it."""

    field: str = Field(description='dotted request field ("override.value"; "" for the body)')
    message: str


class ErrorBody(BaseModel):
    """The body of every error response: what is wrong, how to fix it, the field at fault."""

    error: str = Field(
        description="the error's type: UnknownRun, UnknownNode, InvalidOverride, RunBusy, "
        "ForkError, InvalidRequest, Unauthorized, CrossSiteRequest, NotFound, …"
    )
    message: str = Field(description="one line saying what is wrong")
    hint: str = Field(description="one line saying how to fix it (may be empty)")
    field: str | None = Field(None, description="the request field at fault, when there is one")
    details: list[FieldProblem] | None = Field(
        None, description="every problem of an invalid request (422 InvalidRequest only)"
    )


class RunLinks(BaseModel):
    """Where to follow an accepted run."""

    run: str
    graph: str
    events: str


class RunAccepted(BaseModel):
    """A run or fork accepted for execution (``202``); it executes on a worker thread."""

    run_id: str
    job_id: str | None = Field(
        None, description="the job's id: GET /api/jobs/{job_id} (queued/running/succeeded/failed)"
    )
    status: str = Field(description="queued")
    kind: str = Field(description="record or fork")
    pipeline: str
    parent_run_id: str | None
    fork_node: str | None
    fork_number: int | None = Field(description="1-based number of the fork node")
    override: dict[str, Any] | None
    effects: str | None
    links: RunLinks


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "malformed request: a body that cannot be read, or input the route cannot use",
    401: "the server needs a bearer token and the request has none or a wrong one",
    403: "a state-changing request from another origin (a cross-site page): refused, "
    "nothing is created; or, on a server with users, a non-admin's request to the trace service",
    404: "unknown run, node, trace, job or artifact",
    411: "a chunked state-changing request without Content-Length: not read",
    413: "the request body is larger than the server reads (8 MiB)",
    409: "conflict: the run is still running, failed before the fork node, or the id exists",
    415: "unsupported request content type",
    421: "the Host header names a host this server does not serve (DNS-rebinding guard)",
    422: "invalid request or override; `field` names the offending request field",
    500: "the store holds something it should not (e.g. an artifact file is missing)",
    503: "a call missed the cache and the model endpoint cannot be reached",
}

SERVER_ERRORS = (401, 421)
"""Statuses any route may answer, before the route runs: token and host checks."""
STATE_CHANGING_ERRORS = (*SERVER_ERRORS, 403, 411, 413)
"""Statuses any POST/PUT/PATCH/DELETE route may answer before it runs: also the origin check."""


def response_header(description: str, *, required: bool = True) -> dict[str, Any]:
    """An OpenAPI response header object: a string header with ``description``."""
    return {"description": description, "required": required, "schema": {"type": "string"}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries declaring ``statuses`` with the :class:`ErrorBody` model.

    Args:
        statuses: HTTP statuses, each a key of :data:`ERROR_DESCRIPTIONS`.
    Returns:
        ``{status: {"model": ErrorBody, "description": ...}}``; a 401 also declares its
        ``WWW-Authenticate`` header.
    Raises:
        KeyError: a status without a description (declare what it means first).
    """
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        if status == 401:
            entry["headers"] = {
                "WWW-Authenticate": response_header("the scheme to authenticate with: Bearer")
            }
        out[status] = entry
    return out


LOOKUP_ERRORS = error_responses(404, 422)
"""Errors of a route reading a run, node, trace or job: unknown (404), bad request (422)."""
FORK_ERRORS = error_responses(400, 403, 404, 409, 422)
"""Errors of a route starting a fork."""
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": RunAccepted,
        "description": "accepted: queued, executes in the background",
        "headers": {"Location": response_header("the run's URL")},
    }
}
"""The ``202`` of a route that queues a run or a fork."""
