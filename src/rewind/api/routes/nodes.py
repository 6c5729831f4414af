"""Node routes: a run's node executions, one node's input, output, state and calls (prompts and
responses), a call's whole request or response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from rewind.api import calls_view, views
from rewind.api import models as m
from rewind.api.context import Ctx, ServerContext
from rewind.api.models import typed
from rewind.api.schemas import LOOKUP_ERRORS, SERVER_ERRORS, error_responses
from rewind.engine.plan import param_hints
from rewind.errors import ForkError, UnknownNode
from rewind.replay import Rewind, node_sub_runs, resolve_node
from rewind.serde import display
from rewind.store import NodeRecord, RunRecord

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))


@router.get("/runs/{run_id}/nodes", tags=["nodes"], responses=LOOKUP_ERRORS, **typed(m.NodeList))
def list_nodes(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """The run's node executions (no values; see the node routes for those), each with the
    ids of the sub-runs it spawned (Burr sub-applications)."""
    run = ctx.resolve(run_id)
    spawned = node_sub_runs(ctx.store, run.run_id)
    return {
        "run_id": run.run_id,
        "nodes": [
            views.node_json(n) | {"sub_runs": [c.run_id for c in spawned.get(n.position, [])]}
            for n in ctx.store.nodes_of(run.run_id)
        ],
    }


@router.get(
    "/runs/{run_id}/nodes/{node}", tags=["nodes"], responses=LOOKUP_ERRORS, **typed(m.NodeDetail)
)
def get_node(ctx: Ctx, run_id: str, node: str) -> dict[str, Any]:
    """One node (name, ``name#k`` or 1-based number): its row, the inputs it read, the
    output it wrote, the semantic state after it, and ``param_hints``: per param, the values
    the pipeline allows (``choices``; ``type``/``min``/``max``), where it declares them."""
    run, n = _node_of(ctx, run_id, node)
    rw = ctx.session()
    spawned = node_sub_runs(ctx.store, run.run_id).get(n.position, [])
    return {
        "run_id": run.run_id,
        "node": views.node_json(n),
        "calls": calls_view.calls_detail(
            ctx.store, run.run_id, n.position + 1, n.calls[: calls_view.PAGE]
        ),
        "calls_total": len(n.calls),
        "sub_runs": [views.run_json(c) for c in spawned],
        "input": display(rw.node_input(n)),
        "output": display(rw.node_output(n)),
        "state": _node_state(rw, n),
        # the values a fork may give each param, where the pipeline declares them
        "param_hints": param_hints(rw, run.run_id, n.position + 1),
    }


@router.get(
    "/runs/{run_id}/nodes/{node}/calls",
    tags=["nodes"],
    responses=LOOKUP_ERRORS,
    **typed(m.NodeCalls),
)
def get_node_calls(
    ctx: Ctx,
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
        "calls": calls_view.calls_detail(ctx.store, run.run_id, number, page),
    }


@router.get(
    "/runs/{run_id}/nodes/{node}/calls/{index}/{part}",
    tags=["nodes"],
    response_class=Response,
    responses=error_responses(404, 422) | {200: {"content": {"application/json": {}}}},
)
def get_call_blob(
    ctx: Ctx, run_id: str, node: str, index: int, part: Literal["request", "response"]
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
    data = ctx.store.get_blob(digest)
    media = "application/json" if data[:1] in (b"{", b"[") else "application/octet-stream"
    return Response(data, media_type=media, headers={"X-Content-SHA256": digest})


@router.get(
    "/runs/{run_id}/nodes/{node}/input",
    tags=["nodes"],
    responses=LOOKUP_ERRORS,
    **typed(m.NodeInput),
)
def get_node_input(ctx: Ctx, run_id: str, node: str) -> dict[str, Any]:
    """The node's input document: name, the state fields it read, Burr inputs, params."""
    _, n = _node_of(ctx, run_id, node)
    return {"input_hash": n.input_hash, "input": display(ctx.session().node_input(n))}


@router.get(
    "/runs/{run_id}/nodes/{node}/output",
    tags=["nodes"],
    responses=LOOKUP_ERRORS,
    **typed(m.NodeOutput),
)
def get_node_output(ctx: Ctx, run_id: str, node: str) -> dict[str, Any]:
    """The fields the node wrote."""
    _, n = _node_of(ctx, run_id, node)
    return {"output_hash": n.output_hash, "output": display(ctx.session().node_output(n))}


@router.get(
    "/runs/{run_id}/nodes/{node}/state",
    tags=["nodes"],
    responses=LOOKUP_ERRORS,
    **typed(m.NodeState),
)
def get_node_state(ctx: Ctx, run_id: str, node: str) -> dict[str, Any]:
    """The semantic state after the node (null for a failed node)."""
    _, n = _node_of(ctx, run_id, node)
    return {"state_hash": n.state_hash, "state": _node_state(ctx.session(), n)}


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
