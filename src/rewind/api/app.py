"""The HTTP API (FastAPI; OpenAPI at ``/openapi.json``) and the browser UI it serves at ``/``.

Every database call runs in a synchronous route (Starlette's thread pool) or on a worker thread of
:class:`~rewind.api.runner.RunManager`; the event loop only streams events. Starting a run or a
fork validates the request in the handler (so bad input never creates a run), chooses the run id,
queues the job and answers ``202`` with the id at once.

Errors are JSON ``{"error": <type>, "message": <what>, "hint": <how to fix>, "field": <field>}``
(:class:`~rewind.api.schemas.ErrorBody`, declared on every route): 404 unknown run/node/artifact,
422 invalid override or request (naming the field), 409 a fork of a run still running (or that
failed before the fork node), 401 a missing/wrong bearer token, 403 a state-changing request from
another origin (:mod:`rewind.api.security`), 421 a Host this server does not serve. Every
response, refusals included, carries the same security headers.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

import rewind
from rewind import progress
from rewind.api import access, calls_view, views
from rewind.api import models as m
from rewind.api.access import OPEN, SERVER_TOKEN, Principal, acting_as, check_visible, visible
from rewind.api.effective import effective_config
from rewind.api.manage import (
    NotOwner,
    RunStatusFilter,
    live_run_json,
    manage_routes,
    run_tree,
    unrecorded_runs,
)
from rewind.api.models import typed
from rewind.api.pipelines import PipelineEntry, StartInputs, default_pipelines
from rewind.api.runner import QueueRunManager, ReportManager, RunJob, RunManager
from rewind.api.schemas import SERVER_ERRORS, RunAccepted, error_responses, response_header
from rewind.api.security import bearer_token, cross_site_reason
from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.engine.plan import param_hints
from rewind.errors import (
    EndpointUnavailable,
    ForkError,
    InvalidOverride,
    InvalidRequest,
    RewindError,
    RunBusy,
    StoreError,
    UnknownNode,
    UnknownRun,
)
from rewind.jobs import Job, JobError
from rewind.jobs.queue import QueueUnavailable, queue_url
from rewind.jobs.spec import new_job_id, store_location
from rewind.replay import (
    InputOverride,
    OutputOverride,
    Override,
    ParamOverride,
    Rewind,
    new_run_id,
    node_sub_runs,
    plan_fork,
    resolve_node,
    validate_override,
)
from rewind.serde import display
from rewind.store import NodeRecord, RunRecord, Store, open_store
from rewind.store.store import MIN_PREFIX
from rewind.store.users import authenticate, has_users, run_ids_with_prefix, teammates

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LAZY = "lazy"
"""``create_app(chat_client=LAZY)``: open the configured endpoint on the first cache miss."""


class UnknownJob(RewindError):
    """No grid or stability job of this server has this id."""


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

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)

REFERRER_POLICY = "same-origin"
"""Other sites get no Referer (no run id leaves the UI). Not ``no-referrer``: under it the Fetch
standard sends ``Origin: null`` even on a same-origin POST, which the cross-site check
(:mod:`rewind.api.security`) cannot tell from a sandboxed page's."""


# -- request bodies ----------------------------------------------------------------------------


class ParamOverrideBody(BaseModel):
    """Change one param of a node (``analyse.group_by``); the node re-executes with it."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["param"]
    node: str = Field(min_length=1, max_length=200)
    param: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value (any JSON)")


class OutputOverrideBody(BaseModel):
    """Replace one field the fork node wrote; the node is not executed."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["output"]
    node: str = Field(min_length=1, max_length=200)
    field: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value of the field (any JSON)")


class InputOverrideBody(BaseModel):
    """Change one Burr runtime input of one node (``prompt.prompt``); the node re-executes with
    it, the other nodes keep the recorded inputs."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["input"]
    node: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    value: Any = Field(description="the new value of the input (any JSON)")


OverrideBody = Annotated[
    ParamOverrideBody | OutputOverrideBody | InputOverrideBody, Field(discriminator="kind")
]
NodeRef = Annotated[
    str | int,
    Field(description='node name ("analyse", "analyse#2") or 1-based number (3)'),
]


EffectsMode = Annotated[
    Literal["recorded", "dry-run", "live"],
    Field(
        description="side-effecting calls: serve the recorded result (default), log and execute "
        "nothing (dry-run), or re-execute against a verified pre-state (live)"
    ),
]
RestoreMode = Annotated[
    Literal["refuse", "replace"],
    Field(
        description="effects=live only: when restoring a pinned snapshot, refuse (default) or "
        "replace (delete) files the snapshot does not hold"
    ),
]


AllowCodeChange = Annotated[
    bool,
    Field(
        description="fork even if the pipeline's graph changed since the recording where the "
        "fork runs it (a node renamed, removed or inserted; a transition changed): refused with "
        "409 otherwise. Changed code of a node is always allowed and labelled."
    ),
]


class ForkRequest(BaseModel):
    """Fork a finished run at a node with at most one change (none: an unchanged replay)."""

    model_config = ConfigDict(extra="forbid")
    at: NodeRef
    override: OverrideBody | None = None
    effects: EffectsMode = "recorded"
    allow_code_change: AllowCodeChange = False
    restore: RestoreMode = "refuse"


class ReplayRequest(BaseModel):
    """Unchanged replay of a finished run from a node (default: the first)."""

    model_config = ConfigDict(extra="forbid")
    at: NodeRef = 1
    effects: EffectsMode = "recorded"
    allow_code_change: AllowCodeChange = False
    restore: RestoreMode = "refuse"


class StartRunRequest(BaseModel):
    """Record a new run of a registered pipeline (``GET /api/pipelines``)."""

    model_config = ConfigDict(extra="forbid")
    pipeline: str = Field("research", max_length=200)
    question: str | None = Field(None, min_length=1, max_length=4000)
    state: dict[str, Any] | None = None


_log = logging.getLogger(__name__)


# -- errors ------------------------------------------------------------------------------------


def _error(status: int, kind: str, message: str, hint: str = "", **extra: Any) -> JSONResponse:
    body = {"error": kind, "message": message, "hint": hint, **extra}
    return JSONResponse(body, status_code=status)


def _status_of(exc: RewindError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 400


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RewindError)
    async def rewind_error(_request: Request, exc: RewindError) -> JSONResponse:
        extra = {"field": exc.field}
        return _error(_status_of(exc), type(exc).__name__, exc.message, exc.hint, **extra)

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
        return _error(
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
        return _error(exc.status_code, kind, str(exc.detail), hint)


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


# -- security ----------------------------------------------------------------------------------


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


def _install_security(
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

    def unauthorized() -> Response:
        response = _error(
            401,
            "Unauthorized",
            "this server needs a bearer token",
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
            return unauthorized()
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


# -- the app -----------------------------------------------------------------------------------


class ServerContext:
    """What the routes share: store, run and report managers, pipelines, model client,
    settings."""

    def __init__(
        self,
        store: Store,
        manager: RunManager,
        pipelines: Mapping[str, PipelineEntry],
        chat_client: Any,
        *,
        token_required: bool,
        interrupted_at_start: list[str],
        reports: ReportManager | None = None,
    ) -> None:
        self.store = store
        self.manager = manager
        self.reports = reports or ReportManager(store, chat_client, pipelines=manager.pipelines)
        self.pipelines = pipelines
        self.chat_client = chat_client
        self.token_required = token_required
        self.interrupted_at_start = interrupted_at_start
        self.started_at = time.time()
        self.auth_on: Callable[[], bool] = lambda: token_required

    def resolve(self, run_id: str) -> RunRecord:
        """The run (or a queued job's placeholder) if the requester may see it.

        Raises:
            UnknownRun: no such run, or one the requester may not see (the same 404: run ids
                of other users do not leak).
        """
        who = access.current()
        try:
            return check_visible(self.manager.resolve(run_id), run_id)
        except UnknownRun:
            if who.admin or len(run_id) < MIN_PREFIX:
                raise
        # A prefix shared with runs the user does not see would say "matches several runs":
        # resolve it among the user's runs only.
        found = run_ids_with_prefix(self.store, run_id, who.sees)
        if len(found) > 1:
            raise UnknownRun(
                f"run id prefix {run_id!r} matches several runs",
                "give more characters of the id (see `rewind runs`)",
            )
        if not found:
            raise UnknownRun(f"unknown run {run_id!r}", "list runs with `rewind runs`")
        return check_visible(self.manager.resolve(found[0]), run_id)

    def session(self) -> Rewind:
        """A Rewind on the shared store for reads and validation (never executes here)."""
        rw = Rewind(self.store, chat_client=self.chat_client)
        for entry in self.pipelines.values():
            with suppress(Exception):
                rw.register(entry.build())
        return rw


def create_app(
    store: Store | str | Path,
    *,
    chat_client: Any = LAZY,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    pipelines: Mapping[str, PipelineEntry] | None = None,
    workers: int = 2,
    static_dir: Path | None = None,
    require_auth: bool = False,
    queue: str | None = None,
) -> FastAPI:
    """Build the API + UI application.

    At creation it marks runs the store still lists as ``running`` but whose process is gone (a
    stopped server, a crash) as ``interrupted``.

    Args:
        store: a :class:`Store` or a location for :func:`open_store`.
        chat_client: the model client runs use; :data:`LAZY` (default) opens the configured
            endpoint (``REWIND_BASE_URL`` or the embedded model) on the first cache miss and
            closes it on shutdown; ``None`` makes LLM nodes fail.
        token: when set, every API request needs ``Authorization: Bearer <token>``.
        allowed_hosts: when set, requests whose ``Host`` is not one of these names get 421
            (DNS-rebinding protection for a loopback server without a token).
        pipelines: registry of pipelines runs can be started of (default: the demo).
        workers: runs that may execute at once.
        static_dir: the built UI (default: the package's ``static`` folder).
        require_auth: every API request needs a token even while the store has no users
            (``rewind serve --auth``). Without it, requests need one as soon as the store has
            a user (:mod:`rewind.store.users`): each sees only their own and their team's runs.
        queue: a Redis URL: runs and forks execute on ``rewind worker`` processes (Celery)
            instead of this server's threads; None reads ``REWIND_QUEUE`` (unset: threads).
    """
    owns_store = not isinstance(store, Store)
    st = store if isinstance(store, Store) else open_store(store)
    owns_client = chat_client == LAZY if isinstance(chat_client, str) else False
    if owns_client:
        from rewind.session import LazyChatClient

        chat_client = LazyChatClient()
    registry = dict(pipelines) if pipelines is not None else default_pipelines()
    # Runs a previous server (or any process) left running when it died can never finish. With
    # owners recorded, only runs of dead processes are marked (a live CLI run is left alone).
    reap = getattr(st, "reap_orphans", None)
    interrupted = reap() if callable(reap) else st.mark_interrupted()
    prebuilt = []
    for entry in registry.values():
        with suppress(Exception):
            prebuilt.append(entry.build())
    broker = queue_url(queue)
    manager: RunManager = (
        QueueRunManager(st, broker, chat_client, pipelines=prebuilt)
        if broker
        else RunManager(st, chat_client, workers=workers, pipelines=prebuilt)
    )
    reports = ReportManager(st, chat_client, workers=1, pipelines=prebuilt)
    ctx = ServerContext(
        st,
        manager,
        registry,
        chat_client,
        token_required=token is not None,
        interrupted_at_start=interrupted,
        reports=reports,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        manager.start()
        reports.start()
        yield
        await run_in_threadpool(reports.shutdown)
        await run_in_threadpool(manager.shutdown)
        if owns_client and hasattr(chat_client, "close"):
            await run_in_threadpool(chat_client.close)
        if owns_store:
            st.close()

    app = FastAPI(
        title="Rewind",
        version=rewind.__version__,
        summary="Time-travel debugger for LLM agent pipelines: record, fork, replay, diff.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.rewind = ctx
    _install_error_handlers(app)
    ctx.auth_on = _install_security(app, token, allowed_hosts, st, require_auth=require_auth)
    app.include_router(_api_routes(ctx))
    app.include_router(manage_routes(ctx))
    from rewind.tracing.service import trace_router

    app.include_router(trace_router(st, chat_client=chat_client))
    from rewind.api.reports import report_routes  # imports this module: include it here

    app.include_router(report_routes(ctx))
    _install_static(app, static_dir or STATIC_DIR)
    return app


# -- routes ------------------------------------------------------------------------------------

_LOOKUP = error_responses(404, 422)
_FORK = error_responses(400, 403, 404, 409, 422)
_ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": RunAccepted,
        "description": "accepted: queued, executes in the background",
        "headers": {"Location": response_header("the run's URL")},
    }
}
_ARTIFACT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the artifact's bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            "X-Content-SHA256": response_header("sha256 of the bytes sent"),
            "X-Recorded-SHA256": response_header(
                "sha256 the run recorded (differs: the file changed since)"
            ),
        },
    }
}
_EVENTS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "server-sent events; the schema describes one event",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": {
                            "type": "string",
                            "description": "hello, run_started, node_started, node_finished, "
                            "refresh (a run another process executes), run_finished",
                        },
                        "id": {"type": "string", "description": "sequence number"},
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "description": "one JSON object: the event's fields",
                        },
                    },
                }
            }
        },
    }
}


def _accepted(job: RunJob) -> JSONResponse:
    rid = job.run_id
    body = {
        "run_id": rid,
        "job_id": job.job_id,
        "status": "queued",
        "kind": job.kind,
        "pipeline": job.pipeline,
        "parent_run_id": job.parent_run_id,
        "fork_node": job.fork_node,
        "fork_number": None if job.fork_position is None else job.fork_position + 1,
        "override": job.override,
        "effects": job.effects,
        "links": {
            "run": f"/api/runs/{rid}",
            "graph": f"/api/runs/{rid}/graph",
            "events": f"/api/runs/{rid}/events",
        },
    }
    return JSONResponse(body, status_code=202, headers={"Location": f"/api/runs/{rid}"})


def _node_of(ctx: ServerContext, run_id: str, node: str) -> tuple[RunRecord, NodeRecord]:
    run = ctx.resolve(run_id)
    nodes = ctx.store.nodes_of(run.run_id)
    return run, nodes[resolve_node(run, nodes, node)]


def _node_state(rw: Rewind, n: NodeRecord) -> dict[str, Any] | None:
    if n.error is not None or n.state_hash is None:
        return None
    try:
        state: dict[str, Any] = display(rw.node_state(n))
        return state
    except ForkError:
        return None


def _check_value(value: Any, field: str) -> None:
    try:
        canonical_bytes(value)
    except (CanonicalError, ValueError) as exc:
        raise InvalidOverride(
            f"the new value cannot be hashed: {exc}", "send plain JSON", field=field
        ) from exc


def validate_fork(
    ctx: ServerContext, run_id: str, req: ForkRequest
) -> tuple[RunRecord, int, NodeRecord, Override | None]:
    """Everything :meth:`Rewind.fork` checks before it writes (:func:`plan_fork`, the checks
    ``rewind fork`` makes), done in the request handler.

    Raises:
        UnknownRun, UnknownNode (404), RunBusy, ForkError (409), InvalidOverride (422, with the
        offending request field in ``.field``).
    """
    parent = ctx.resolve(run_id)
    if parent.status in views.ACTIVE_STATUSES:
        raise RunBusy(
            f"run {parent.run_id} is still {parent.status}",
            "wait for its run_finished event (GET /api/runs/{id}/events), then fork it",
        )
    if parent.is_sub_run:
        # Forked by re-running its spawning node (Rewind.fork_sub_run): the sub-run's own checks
        # here; Rewind.fork plans the top-level run's fork (graph, drift) when the job runs.
        nodes = ctx.store.nodes_of(parent.run_id)
        sub_override = _engine_override(req.override)
        idx = resolve_node(parent, nodes, req.at)
        if isinstance(sub_override, OutputOverride):
            raise InvalidOverride(
                "replacing the output of a sub-run's node is not supported",
                "send an input or param override, or fork the spawning run",
                field="override",
            )
        validate_override(nodes, idx, sub_override, node_inputs=ctx.session().node_runtime_inputs)
        return parent, idx, nodes[idx], sub_override
    plan = plan_fork(
        ctx.session(),
        parent.run_id,
        at=req.at,
        override=_engine_override(req.override),
        effects=req.effects,
        restore=req.restore,
        allow_code_change=req.allow_code_change,
    )
    return plan.parent, plan.index, plan.fork_node, plan.override


def _engine_override(
    body: ParamOverrideBody | OutputOverrideBody | InputOverrideBody | None,
) -> Override | None:
    """The engine's override for a request's ``override`` (None: an unchanged replay)."""
    if isinstance(body, OutputOverrideBody):
        return OutputOverride(body.node, body.field, body.value)
    if isinstance(body, ParamOverrideBody):
        return ParamOverride(body.node, body.param, body.value)
    if isinstance(body, InputOverrideBody):
        return InputOverride(body.node, body.name, body.value)
    return None


def _api_routes(ctx: ServerContext) -> APIRouter:
    r = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))
    store, manager = ctx.store, ctx.manager

    @r.get("/health", tags=["server"], **typed(m.Health))
    def health() -> dict[str, Any]:
        """Liveness: the store answers; runs in flight."""
        with store.read() as conn:
            conn.exec_driver_sql("SELECT 1")
        return {
            "status": "ok",
            "version": rewind.__version__,
            "runs_in_flight": len(manager.active()),
            "reports_in_flight": len(ctx.reports.active()),
            "execution": manager.execution(),
            "interrupted_at_start": ctx.interrupted_at_start if access.current().admin else [],
            "uptime_s": round(time.time() - ctx.started_at, 1),
        }

    @r.get("/settings", tags=["server"], **typed(m.Settings))
    def settings() -> dict[str, Any]:
        """Model endpoint, model, temperature default, store location (never secrets), and
        ``effective``: each setting in force with where it came from."""
        out = _settings(ctx)
        out["effective"] = effective_config(out, store, token_required=ctx.auth_on())
        return out

    @r.get("/pipelines", tags=["runs"], **typed(m.PipelineList))
    def list_pipelines() -> dict[str, Any]:
        """Pipelines runs can be started of, with their nodes and edges."""
        out = []
        for entry in ctx.pipelines.values():
            p = entry.build()
            out.append(
                {
                    "name": entry.name,
                    "description": entry.description,
                    "inputs": dict(entry.inputs),
                    "nodes": p.node_names(),
                    "edges": [{"src": s, "dst": d, "condition": c} for s, d, c in p.edges()],
                }
            )
        return {"pipelines": out}

    @r.get("/runs", tags=["runs"], responses=error_responses(422), **typed(m.RunsResponse))
    def list_runs(
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        include_sub_runs: bool = False,
        pipeline: Annotated[str | None, Query(max_length=200, description="exact name")] = None,
        status: Annotated[
            list[RunStatusFilter] | None, Query(description="repeat for several statuses")
        ] = None,
        since: Annotated[float | None, Query(description="created at or after (unix s)")] = None,
        until: Annotated[float | None, Query(description="created before (unix s)")] = None,
        q: Annotated[
            str | None,
            Query(
                max_length=200,
                description="run id prefix, or text in the pipeline, fork node, override, error",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Runs the requester may see, newest first, filtered (``pipeline``, ``status``,
        ``since``/``until``, ``q``), and their tree: a fork nests under its parent, grid
        variants and stability samples under their job, sub-runs (Burr sub-applications)
        under the run that spawned them (``sub_runs`` of the run's tree item; the top-level
        ``sub_runs`` holds their records). ``include_sub_runs`` lists sub-runs in ``runs`` and
        matches them against the filters too. Runs carry no tags, so there is no tag filter."""
        who = access.current()
        statuses = [s.value for s in status] if status else None
        records = store.list_runs(
            limit,
            include_sub_runs=include_sub_runs,
            created_by=None if who.admin else who.sees,
            pipeline=pipeline,
            statuses=statuses,
            created_after=since,
            created_before=until,
            search=q,
        )
        if statuses:  # a dead process's "running" run reads as interrupted
            records = [r for r in records if r.status in statuses]
        known = {r.run_id for r in records}
        # runs this server accepted that have no row: queued, or failed before they started
        # (listed like any other failed run, never vanishing)
        queued = visible(
            unrecorded_runs(
                store,
                manager.jobs(),
                known,
                pipeline=pipeline,
                statuses=statuses,
                since=since,
                until=until,
                q=q,
            )
        )
        subs = [
            r
            for r in visible(store.sub_runs_of([r.run_id for r in records]))
            if r.run_id not in known
        ]
        runs = [views.run_json(x) for x in queued] + [live_run_json(ctx, x) for x in records]
        sub_runs = [live_run_json(ctx, x) for x in subs]
        return {"runs": runs, "sub_runs": sub_runs, "tree": run_tree(runs + sub_runs)}

    @r.post(
        "/runs",
        status_code=202,
        tags=["runs"],
        responses=_ACCEPTED | error_responses(400, 403, 422),
    )
    def start_run(req: StartRunRequest) -> JSONResponse:
        """Record a new run; answers 202 with its id at once, the run executes in the
        background (follow ``/api/runs/{id}/events`` or poll ``/api/runs/{id}/graph``)."""
        entry = ctx.pipelines.get(req.pipeline)
        if entry is None:
            raise InvalidOverride(
                f"unknown pipeline {req.pipeline!r}",
                f"known pipelines: {', '.join(sorted(ctx.pipelines)) or 'none'}",
                field="pipeline",
            )
        try:
            state = entry.initial_state(StartInputs(question=req.question, state=req.state))
        except RewindError:
            raise
        except (ValueError, OSError) as exc:
            raise InvalidOverride(f"cannot build the initial state: {exc}", field="state") from exc
        _check_value(state, "state")
        pipeline = entry.build()
        rid = new_run_id()
        config = {"model": _model_name(ctx.chat_client), "source": "api"}

        spec = Job(
            "record",
            new_job_id(),
            rid,
            store_location(store),
            pipeline.name,
            pipeline.ref or "",
            {"state": state, "config": config, "created_by": access.current().name},
        )
        created_by = access.current().name
        return _accepted(
            manager.submit(
                RunJob(rid, "record", pipeline.name, None, created_by=created_by, spec=spec)
            )
        )

    @r.get("/jobs/{job_id}", tags=["runs"], responses=_LOOKUP)
    def get_job(job_id: str) -> dict[str, Any]:
        """A run or fork job as the store keeps it: ``queued``, ``running``, ``succeeded`` or
        ``failed`` (with ``error``), its attempts, the run of the current attempt and the runs
        of earlier attempts a lost worker left ``interrupted``."""
        from rewind.jobs import state as job_state

        row = job_state.get_job(store, job_id)
        if row is None or not access.current().can_see(row.job.args.get("created_by")):
            # another user's job answers like one that does not exist
            raise UnknownJob(f"no job {job_id!r}", "job ids come from POST /api/runs or /fork")
        return row.to_json()

    @r.get("/runs/{run_id}", tags=["runs"], responses=_LOOKUP, **typed(m.RunDetail))
    def get_run(run_id: str) -> dict[str, Any]:
        """A run with its parent chain, children (forks) and artifacts."""
        run = ctx.resolve(run_id)
        who = access.current()
        ancestors = []
        for current in store.ancestors(run):
            if not who.can_see(current.created_by):
                break  # a fork of a run shared no longer: its chain stops here for this user
            ancestors.append(views.run_json(current))
        return live_run_json(ctx, run) | {
            "ancestors": ancestors,
            "children": [views.run_json(c) for c in visible(store.children(run.run_id))],
            # runs of the Burr sub-applications its nodes spawned, by node number
            "sub_runs": [
                {"number": position + 1, "runs": [views.run_json(c) for c in visible(subs)]}
                for position, subs in sorted(node_sub_runs(store, run.run_id).items())
            ],
            "artifacts": [_artifact_json(run.run_id, a) for a in store.artifacts_of(run.run_id)],
            "live": manager.is_active(run.run_id),
            # A fork's code drift from its parent's recording (code changed, graph changes
            # accepted, or unchecked); None for a recorded run or one stored before graphs.
            "drift": graph.drift if (graph := store.run_graph(run.run_id)) else None,
        }

    @r.get("/runs/{run_id}/graph", tags=["runs"], responses=_LOOKUP, **typed(m.Graph))
    def get_graph(run_id: str) -> dict[str, Any]:
        """The run's pipeline graph (nodes, edges) and node executions with status, cache
        outcome + reason, hashes, latency and tokens; poll it while the run is live."""
        run = ctx.resolve(run_id)
        job = manager.job(run.run_id)
        edges = store.edges_of(run.pipeline)
        if not edges:
            entry = ctx.pipelines.get(run.pipeline)
            if entry is not None:
                edges = entry.build().edges()
        finished = dict(job.finished) if job else {}
        running = job.running if job and job.state != "done" else None
        nodes = store.nodes_of(run.run_id)
        if run.status == "running" or (job is not None and job.state != "done"):
            run = manager.resolve(run.run_id)
        if run.status == "running" and running is None:
            # executed by another process (a `rewind run`, a worker): the store says which node
            running = progress.live_progress(store, run.run_id)["node"]
        out = views.graph_json(run, nodes, edges, live_finished=finished, running=running)
        out["run"] = live_run_json(ctx, run)
        return out

    @r.get("/runs/{run_id}/nodes", tags=["nodes"], responses=_LOOKUP, **typed(m.NodeList))
    def list_nodes(run_id: str) -> dict[str, Any]:
        """The run's node executions (no values; see the node routes for those), each with the
        ids of the sub-runs it spawned (Burr sub-applications)."""
        run = ctx.resolve(run_id)
        spawned = node_sub_runs(store, run.run_id)
        return {
            "run_id": run.run_id,
            "nodes": [
                views.node_json(n) | {"sub_runs": [c.run_id for c in spawned.get(n.position, [])]}
                for n in store.nodes_of(run.run_id)
            ],
        }

    @r.get("/runs/{run_id}/nodes/{node}", tags=["nodes"], responses=_LOOKUP, **typed(m.NodeDetail))
    def get_node(run_id: str, node: str) -> dict[str, Any]:
        """One node (name, ``name#k`` or 1-based number): its row, the inputs it read, the
        output it wrote, the semantic state after it, and ``param_hints``: per param, the values
        the pipeline allows (``choices``; ``type``/``min``/``max``), where it declares them."""
        run, n = _node_of(ctx, run_id, node)
        rw = ctx.session()
        spawned = node_sub_runs(store, run.run_id).get(n.position, [])
        return {
            "run_id": run.run_id,
            "node": views.node_json(n),
            "calls": calls_view.calls_detail(
                store, run.run_id, n.position + 1, n.calls[: calls_view.PAGE]
            ),
            "calls_total": len(n.calls),
            "sub_runs": [views.run_json(c) for c in spawned],
            "input": display(rw.node_input(n)),
            "output": display(rw.node_output(n)),
            "state": _node_state(rw, n),
            # the values a fork may give each param, where the pipeline declares them
            "param_hints": param_hints(rw, run.run_id, n.position + 1),
        }

    @r.get(
        "/runs/{run_id}/nodes/{node}/calls", tags=["nodes"], responses=_LOOKUP, **typed(m.NodeCalls)
    )
    def get_node_calls(
        run_id: str,
        node: str,
        offset: Annotated[int, Query(ge=0, description="first call (0-based)")] = 0,
        limit: Annotated[int, Query(ge=1, le=500, description="calls per page")] = 50,
    ) -> dict[str, Any]:
        """The node's LLM and tool calls with their requests (messages with roles, params,
        tools, response schema; a tool's args) and responses (content, tool calls, finish
        reason, usage; a tool's result), cache outcome, key and latency, a page at a time
        (``total`` calls in all). Long strings and lists are cut (``request_truncated``);
        ``request_url``/``response_url`` serve the whole."""
        run, n = _node_of(ctx, run_id, node)
        number = n.position + 1
        page = n.calls[offset : offset + limit]
        return {
            "run_id": run.run_id,
            "number": number,
            "total": len(n.calls),
            "offset": offset,
            "calls": calls_view.calls_detail(store, run.run_id, number, page),
        }

    @r.get(
        "/runs/{run_id}/nodes/{node}/calls/{index}/{part}",
        tags=["nodes"],
        response_class=Response,
        responses=error_responses(404, 422) | {200: {"content": {"application/json": {}}}},
    )
    def get_call_blob(
        run_id: str, node: str, index: int, part: Literal["request", "response"]
    ) -> Response:
        """The whole request or response bytes of one call, as recorded (the call's
        ``request_hash``/``result_hash`` blob)."""
        run, n = _node_of(ctx, run_id, node)
        call = next((c for c in n.calls if c.call_index == index), None)
        if call is None:
            raise UnknownNode(
                f"node {n.position + 1} of run {run.run_id[:12]} has no call {index}",
                f"list them with GET /api/runs/{run.run_id[:12]}/nodes/{n.position + 1}/calls",
                field="index",
            )
        digest = call.request_hash if part == "request" else call.result_hash
        if not digest:
            raise UnknownNode(f"call {index} recorded no {part}", "", field="part")
        data = store.get_blob(digest)
        media = "application/json" if data[:1] in (b"{", b"[") else "application/octet-stream"
        return Response(data, media_type=media, headers={"X-Content-SHA256": digest})

    @r.get(
        "/runs/{run_id}/nodes/{node}/input", tags=["nodes"], responses=_LOOKUP, **typed(m.NodeInput)
    )
    def get_node_input(run_id: str, node: str) -> dict[str, Any]:
        """The node's input document: name, the state fields it read, Burr inputs, params."""
        _, n = _node_of(ctx, run_id, node)
        return {"input_hash": n.input_hash, "input": display(ctx.session().node_input(n))}

    @r.get(
        "/runs/{run_id}/nodes/{node}/output",
        tags=["nodes"],
        responses=_LOOKUP,
        **typed(m.NodeOutput),
    )
    def get_node_output(run_id: str, node: str) -> dict[str, Any]:
        """The fields the node wrote."""
        _, n = _node_of(ctx, run_id, node)
        return {"output_hash": n.output_hash, "output": display(ctx.session().node_output(n))}

    @r.get(
        "/runs/{run_id}/nodes/{node}/state", tags=["nodes"], responses=_LOOKUP, **typed(m.NodeState)
    )
    def get_node_state(run_id: str, node: str) -> dict[str, Any]:
        """The semantic state after the node (null for a failed node)."""
        _, n = _node_of(ctx, run_id, node)
        return {"state_hash": n.state_hash, "state": _node_state(ctx.session(), n)}

    @r.post("/runs/{run_id}/fork", status_code=202, tags=["forks"], responses=_ACCEPTED | _FORK)
    def fork(run_id: str, req: ForkRequest) -> JSONResponse:
        """Fork a finished run at ``at`` with one override (param or output) or none (an
        unchanged replay). Validated here; answers 202 with the new run's id at once."""
        parent, idx, fork_node, override = validate_fork(ctx, run_id, req)
        return _submit_fork(
            ctx, parent, idx, fork_node, override, req.effects, req.allow_code_change, req.restore
        )

    @r.post("/runs/{run_id}/replay", status_code=202, tags=["forks"], responses=_ACCEPTED | _FORK)
    def replay(run_id: str, req: ReplayRequest | None = None) -> JSONResponse:
        """Unchanged replay from ``at`` (default node 1): expected all cache hits, 0 tokens."""
        req = req or ReplayRequest()
        body = ForkRequest(
            at=req.at,
            override=None,
            effects=req.effects,
            allow_code_change=req.allow_code_change,
            restore=req.restore,
        )
        parent, idx, fork_node, override = validate_fork(ctx, run_id, body)
        return _submit_fork(
            ctx, parent, idx, fork_node, override, req.effects, req.allow_code_change, req.restore
        )

    @r.get("/runs/{run_id}/cost", tags=["diff"], responses=_LOOKUP, **typed(m.Cost))
    def cost(run_id: str, against: str | None = None) -> dict[str, Any]:
        """Tokens and latency of the run vs ``against`` (default: its parent): original,
        replay, delta and saved."""
        run = ctx.resolve(run_id)
        other_id = against or run.parent_run_id
        if other_id is None:
            raise InvalidOverride(
                f"run {run.run_id[:12]} has no parent to compare with",
                "pass ?against=RUN",
                field="against",
            )
        original = ctx.resolve(other_id)
        return views.cost_json(store, original, run)

    @r.get("/diff", tags=["diff"], responses=_LOOKUP, **typed(m.Diff))
    def diff(
        a: Annotated[str, Query(description="reference run (e.g. the parent)")],
        b: Annotated[str, Query(description="compared run (e.g. the fork)")],
    ) -> dict[str, Any]:
        """Field-level diff of two runs: aligned nodes, changed paths with old/new values, hash
        match, first divergence, token deltas, unified text diffs for long strings."""
        ra, rb = ctx.resolve(a), ctx.resolve(b)
        return ctx.session().diff(ra.run_id, rb.run_id).to_json()

    @r.get(
        "/runs/{run_id}/artifacts", tags=["artifacts"], responses=_LOOKUP, **typed(m.ArtifactList)
    )
    def list_artifacts(run_id: str) -> dict[str, Any]:
        """Files the run published (name, sha256, size, download URL)."""
        run = ctx.resolve(run_id)
        return {
            "run_id": run.run_id,
            "artifacts": [_artifact_json(run.run_id, a) for a in store.artifacts_of(run.run_id)],
        }

    @r.get(
        "/runs/{run_id}/artifacts/{name}",
        tags=["artifacts"],
        response_class=Response,
        responses=_ARTIFACT | _LOOKUP | error_responses(500),
    )
    def download_artifact(run_id: str, name: str) -> FileResponse:
        """Download an artifact by name, looked up in the run's artifact records (the name is
        never used as a path)."""
        run = ctx.resolve(run_id)
        found = next((a for a in store.artifacts_of(run.run_id) if a["name"] == name), None)
        if found is None:
            raise UnknownNode(
                f"run {run.run_id[:12]} has no artifact {name!r}",
                "list them with GET /api/runs/{id}/artifacts",
                field="name",
            )
        path = Path(found["path"]).resolve()
        root = store.root.resolve()
        if not path.is_relative_to(root):
            raise StoreError(f"artifact {name!r} is missing from the store folder", "")
        if path.is_file():
            data = path.read_bytes()
        elif store.objects is not None:  # published by a worker elsewhere: the object's copy
            data = _artifact_object(store, run.run_id, found)
        else:
            raise StoreError(f"artifact {name!r} is missing from the store folder", "")
        actual = sha256_hex(data)
        headers = {
            "X-Content-SHA256": actual,
            "X-Recorded-SHA256": found["sha256"],
            "Content-Disposition": f'attachment; filename="{found["name"]}"',
        }
        if actual != found["sha256"]:
            # The file changed after the run wrote it: never vouch for it with the old hash.
            headers["Warning"] = '199 rewind "artifact differs from what the run recorded"'
        return Response(data, media_type="application/octet-stream", headers=headers)

    @r.get(
        "/runs/{run_id}/events",
        tags=["runs"],
        response_class=EventSourceResponse,
        responses=_EVENTS | _LOOKUP,
    )
    async def events(run_id: str, request: Request) -> EventSourceResponse:
        """Server-sent events of a run: ``node_started``, ``node_finished``, ``run_finished``.

        A late subscriber first gets the events so far; a finished run sends ``run_finished``
        and closes. A run executed by another process is followed by polling the store
        (``refresh`` events). Fallback without SSE: poll ``/api/runs/{id}/graph``.
        """
        run = await run_in_threadpool(ctx.resolve, run_id)
        loop = asyncio.get_running_loop()
        q, history, done = manager.subscribe(run.run_id, loop)
        return EventSourceResponse(_event_stream(ctx, run, q, history, done, request), ping=10)

    return r


def _submit_fork(
    ctx: ServerContext,
    parent: RunRecord,
    idx: int,
    fork_node: NodeRecord,
    override: Override | None,
    effects: str,
    allow_code_change: bool = False,
    restore: str = "refuse",
) -> JSONResponse:
    rid = new_run_id()
    spec = Job(
        "fork",
        new_job_id(),
        rid,
        store_location(ctx.store),
        parent.pipeline,
        parent.pipeline_ref,
        {
            "parent_run_id": parent.run_id,
            "at": idx + 1,
            "fork_node": fork_node.name,
            "override": override.to_json() if override else None,
            "effects": effects,
            "allow_code_change": allow_code_change,
            "restore": restore,
            "created_by": access.current().name,
        },
    )
    return _accepted(
        ctx.manager.submit(
            RunJob(
                rid,
                "fork",
                parent.pipeline,
                None,
                parent_run_id=parent.run_id,
                fork_node=fork_node.name,
                fork_position=idx,
                override=override.to_json() if override else None,
                effects=effects,
                created_by=access.current().name,
                spec=spec,
            )
        )
    )


def _sse(item: dict[str, Any]) -> dict[str, Any]:
    return {"event": item["event"], "id": str(item.get("seq", 0)), "data": json.dumps(item)}


async def _event_stream(
    ctx: ServerContext,
    run: RunRecord,
    q: asyncio.Queue[dict[str, Any]],
    history: list[dict[str, Any]],
    done: bool,
    request: Request,
) -> AsyncIterator[dict[str, Any]]:
    manager = ctx.manager
    try:
        yield _sse({"event": "hello", "run_id": run.run_id, "status": run.status, "seq": 0})
        for item in history:
            yield _sse(item)
            if item["event"] == "run_finished":
                return
        if done:
            if run.status in views.ACTIVE_STATUSES:
                async for item in _follow_store(ctx, run.run_id, request):
                    yield _sse(item)
                return
            final = await run_in_threadpool(manager.resolve, run.run_id)
            yield _sse(
                {
                    "event": "run_finished",
                    "run_id": final.run_id,
                    "status": final.status,
                    "error": final.error,
                    "seq": 0,
                }
            )
            return
        while True:
            item = await q.get()
            yield _sse(item)
            if item["event"] == "run_finished":
                return
    finally:
        manager.unsubscribe(run.run_id, q)


async def _follow_store(
    ctx: ServerContext, run_id: str, request: Request
) -> AsyncIterator[dict[str, Any]]:
    """Follow a run another process executes by polling the store once a second."""
    seen: tuple[Any, ...] | None = None
    while not await request.is_disconnected():
        run = await run_in_threadpool(ctx.manager.resolve, run_id)
        now = await run_in_threadpool(progress.live_progress, ctx.store, run_id)
        # every node row so far, inherited ones included (live_progress counts executed ones)
        count = len(await run_in_threadpool(ctx.store.nodes_of, run_id, with_calls=False))
        node = now["node"] or {}
        key = (count, node.get("position"), now["tokens"])
        if key != seen:
            seen = key
            yield {
                "event": "refresh",
                "run_id": run_id,
                "nodes": count,
                "running": now["node"],
                "tokens": now["tokens"],
                "seq": 0,
            }
        if run.status not in views.ACTIVE_STATUSES:
            yield {"event": "run_finished", "run_id": run_id, "status": run.status, "seq": 0}
            return
        await asyncio.sleep(1.0)


def _artifact_object(store: Store, run_id: str, found: dict[str, Any]) -> bytes:
    """An artifact's bytes from the object store's copy (hash-verified).

    Raises:
        StoreError: the object is missing, unreadable or does not match the recorded sha256.
    """
    from rewind.store.objects import artifact_key

    objects = store.objects
    assert objects is not None
    ref = f"{objects.url}/{artifact_key(run_id, found['name'])}"
    return objects.get_object(ref, found["sha256"])


def _artifact_json(run_id: str, a: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": a["name"],
        "sha256": a["sha256"],
        "size": a["size"],
        "url": f"/api/runs/{run_id}/artifacts/{a['name']}",
    }


def _model_name(client: Any) -> str | None:
    endpoint = getattr(client, "endpoint", None)
    return getattr(endpoint, "model", None)


def _settings(ctx: ServerContext) -> dict[str, Any]:
    from rewind.examples import research
    from rewind.localmodel import DEFAULT_MODEL_ALIAS
    from rewind.session import LazyChatClient

    client = ctx.chat_client
    endpoint = getattr(client, "endpoint", None)
    base_url = getattr(endpoint, "base_url", None)
    env_url = os.environ.get("REWIND_BASE_URL", "").strip()
    if client is None:
        kind, url = "none", None
    elif not isinstance(client, LazyChatClient):
        kind, url = "client", base_url
    elif base_url:
        kind, url = ("configured" if env_url else "embedded"), base_url
    elif env_url:
        kind, url = "configured", env_url
    else:
        kind, url = "embedded", None
    model = _model_name(client) or os.environ.get("REWIND_MODEL") or DEFAULT_MODEL_ALIAS
    return {
        "model_endpoint": {
            "kind": kind,
            "base_url": url,
            "description": {
                "embedded": "SmolLM2-135M-Instruct served by llama-cpp-python on a free "
                "127.0.0.1 port, started on the first cache miss",
                "configured": "REWIND_BASE_URL (an OpenAI-compatible endpoint)",
                "none": "no model client: LLM nodes fail",
                "client": "the model client this server was created with",
            }[kind],
            "started": bool(getattr(client, "started", base_url is not None)),
            "api_key_set": bool(os.environ.get("REWIND_API_KEY", "").strip()),
        },
        "model": model,
        "temperature_default": research.DEFAULT_TEMPERATURE,
        "store": {
            "root": str(ctx.store.root),
            "database": ctx.store.engine.url.render_as_string(hide_password=True),
            "dialect": ctx.store.engine.dialect.name,
        },
        "auth": {
            "token_required": ctx.auth_on(),
            "user": access.current().name,
            "admin": access.current().admin,
        },
        "workers": len(ctx.manager._threads),
        "version": rewind.__version__,
        "pipelines": sorted(ctx.pipelines),
    }


# -- static UI ---------------------------------------------------------------------------------

_NOT_BUILT = """<!doctype html><meta charset="utf-8"><title>Rewind</title>
<body style="font-family:sans-serif;max-width:40rem;margin:3rem auto">
<h1>Rewind</h1><p>The API is up (<a href="/openapi.json">/openapi.json</a>), but the browser UI
has not been built. Build it with:</p><pre>cd web &amp;&amp; npm ci &amp;&amp; npm run build</pre>
</body>"""


def _install_static(app: FastAPI, static_dir: Path) -> None:
    index = static_dir / "index.html"
    assets = static_dir / "assets"
    if assets.is_dir():
        app.mount("/assets", StaticFiles(directory=assets), name="assets")

    @app.get("/", include_in_schema=False)
    def ui() -> Response:
        if not index.is_file():
            return HTMLResponse(_NOT_BUILT)
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.svg", include_in_schema=False)
    def favicon() -> Response:
        icon = static_dir / "favicon.svg"
        if not icon.is_file():
            raise StarletteHTTPException(404, "no favicon")
        return FileResponse(icon)
