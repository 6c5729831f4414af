"""Fork routes: fork a finished run at a node with one change, or replay it unchanged; validated in
the handler (nothing is written for a bad request), answered 202 with the new run's id.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rewind.api import access, views
from rewind.api.context import Ctx, ServerContext
from rewind.api.requests import (
    ForkRequest,
    InputOverrideBody,
    OutputOverrideBody,
    ParamOverrideBody,
    ReplayRequest,
)
from rewind.api.runner import RunJob
from rewind.api.schemas import ACCEPTED, FORK_ERRORS, SERVER_ERRORS, error_responses
from rewind.canonical import CanonicalError, canonical_bytes
from rewind.errors import InvalidOverride, RunBusy
from rewind.jobs import Job
from rewind.jobs.spec import new_job_id, store_location
from rewind.replay import (
    InputOverride,
    OutputOverride,
    Override,
    ParamOverride,
    new_run_id,
    plan_fork,
    resolve_node,
    validate_override,
)
from rewind.store import NodeRecord, RunRecord

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))


@router.post(
    "/runs/{run_id}/fork", status_code=202, tags=["forks"], responses=ACCEPTED | FORK_ERRORS
)
def fork(ctx: Ctx, run_id: str, req: ForkRequest) -> JSONResponse:
    """Fork a finished run at ``at`` with one override (param or output) or none (an
    unchanged replay). Validated here; answers 202 with the new run's id at once."""
    parent, idx, fork_node, override = validate_fork(ctx, run_id, req)
    return _submit_fork(
        ctx, parent, idx, fork_node, override, req.effects, req.allow_code_change, req.restore
    )


@router.post(
    "/runs/{run_id}/replay", status_code=202, tags=["forks"], responses=ACCEPTED | FORK_ERRORS
)
def replay(ctx: Ctx, run_id: str, req: ReplayRequest | None = None) -> JSONResponse:
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


def accepted(job: RunJob) -> JSONResponse:
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


def check_value(value: Any, field: str) -> None:
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
    return accepted(
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
