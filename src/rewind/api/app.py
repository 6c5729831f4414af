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

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

import rewind
from rewind.api.context import ServerContext, UnknownJob
from rewind.api.errors import install_error_handlers
from rewind.api.manage import router as manage_router
from rewind.api.middleware import (
    CSP,
    LOOPBACK_HOSTS,
    MAX_REQUEST_BYTES,
    REFERRER_POLICY,
    install_security,
    is_loopback,
)
from rewind.api.pipelines import PipelineEntry, default_pipelines
from rewind.api.reports import router as report_router
from rewind.api.requests import ForkRequest, NodeRef, ReplayRequest, StartRunRequest
from rewind.api.routes import artifacts, diff, events, forks, nodes, runs, server
from rewind.api.routes.forks import validate_fork
from rewind.api.runner import QueueRunManager, ReportManager, RunManager
from rewind.api.static import STATIC_DIR, install_static
from rewind.jobs.queue import queue_url
from rewind.store import Store, open_store

__all__ = [
    "CSP",
    "LAZY",
    "LOOPBACK_HOSTS",
    "MAX_REQUEST_BYTES",
    "REFERRER_POLICY",
    "STATIC_DIR",
    "ForkRequest",
    "NodeRef",
    "ReplayRequest",
    "ServerContext",
    "StartRunRequest",
    "UnknownJob",
    "create_app",
    "is_loopback",
    "validate_fork",
]

LAZY = "lazy"
"""``create_app(chat_client=LAZY)``: open the configured endpoint on the first cache miss."""


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
    install_error_handlers(app)
    ctx.auth_on = install_security(app, token, allowed_hosts, st, require_auth=require_auth)
    for module in (server, runs, nodes, forks, diff, artifacts, events):
        app.include_router(module.router)
    app.include_router(manage_router)
    # imported here: rewind.tracing.service imports this package (its models)
    from rewind.tracing.service import trace_router

    app.include_router(trace_router(st, chat_client=chat_client))
    app.include_router(report_router)
    install_static(app, static_dir or STATIC_DIR)
    return app
