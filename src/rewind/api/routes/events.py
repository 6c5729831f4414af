"""The event stream of a run (server-sent events), from this server's workers or, for a run another
process executes, from the store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from rewind import progress
from rewind.api import views
from rewind.api.context import Ctx, ServerContext
from rewind.api.schemas import LOOKUP_ERRORS, SERVER_ERRORS, error_responses
from rewind.store import RunRecord

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))

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


@router.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    response_class=EventSourceResponse,
    responses=_EVENTS | LOOKUP_ERRORS,
)
async def events(ctx: Ctx, run_id: str, request: Request) -> EventSourceResponse:
    """Server-sent events of a run: ``node_started``, ``node_finished``, ``run_finished``.

    A late subscriber first gets the events so far; a finished run sends ``run_finished``
    and closes. A run executed by another process is followed by polling the store
    (``refresh`` events). Fallback without SSE: poll ``/api/runs/{id}/graph``.
    """
    run = await run_in_threadpool(ctx.resolve, run_id)
    loop = asyncio.get_running_loop()
    q, history, done = ctx.manager.subscribe(run.run_id, loop)
    return EventSourceResponse(_event_stream(ctx, run, q, history, done, request), ping=10)


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


FOLLOW_POLL_S = 0.25
"""Seconds between two reads of a run another process executes (three short reads of its rows):
a node finished there shows within a quarter of a second, as one executed here does at once."""


async def _follow_store(
    ctx: ServerContext, run_id: str, request: Request
) -> AsyncIterator[dict[str, Any]]:
    """Follow a run another process executes by polling the store every
    :data:`FOLLOW_POLL_S`."""
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
        await asyncio.sleep(FOLLOW_POLL_S)
