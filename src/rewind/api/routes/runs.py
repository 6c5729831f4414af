"""Run routes: the runs list and its tree, starting a run, a run's job, a run with its lineage, a
run's graph.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from rewind import progress
from rewind.api import access, views
from rewind.api import models as m
from rewind.api.access import visible
from rewind.api.context import Ctx, UnknownJob
from rewind.api.manage import RunStatusFilter, live_run_json, run_tree, unrecorded_runs
from rewind.api.models import typed
from rewind.api.pipelines import StartInputs
from rewind.api.requests import StartRunRequest
from rewind.api.routes.artifacts import artifact_json
from rewind.api.routes.forks import accepted, check_value
from rewind.api.routes.server import model_name
from rewind.api.runner import RunJob
from rewind.api.schemas import ACCEPTED, LOOKUP_ERRORS, SERVER_ERRORS, error_responses
from rewind.errors import InvalidOverride, RewindError
from rewind.jobs import Job
from rewind.jobs.spec import new_job_id, store_location
from rewind.replay import new_run_id, node_sub_runs

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))


@router.get("/runs", tags=["runs"], responses=error_responses(422), **typed(m.RunsResponse))
def list_runs(
    ctx: Ctx,
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
    records = ctx.store.list_runs(
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
            ctx.store,
            ctx.manager.jobs(),
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
        for r in visible(ctx.store.sub_runs_of([r.run_id for r in records]))
        if r.run_id not in known
    ]
    runs = [views.run_json(x) for x in queued] + [live_run_json(ctx, x) for x in records]
    sub_runs = [live_run_json(ctx, x) for x in subs]
    return {"runs": runs, "sub_runs": sub_runs, "tree": run_tree(runs + sub_runs)}


@router.post(
    "/runs",
    status_code=202,
    tags=["runs"],
    responses=ACCEPTED | error_responses(400, 403, 422),
)
def start_run(ctx: Ctx, req: StartRunRequest) -> JSONResponse:
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
    check_value(state, "state")
    pipeline = entry.build()
    rid = new_run_id()
    config = {"model": model_name(ctx.chat_client), "source": "api"}

    spec = Job(
        "record",
        new_job_id(),
        rid,
        store_location(ctx.store),
        pipeline.name,
        pipeline.ref or "",
        {"state": state, "config": config, "created_by": access.current().name},
    )
    created_by = access.current().name
    return accepted(
        ctx.manager.submit(
            RunJob(rid, "record", pipeline.name, None, created_by=created_by, spec=spec)
        )
    )


@router.get("/jobs/{job_id}", tags=["runs"], responses=LOOKUP_ERRORS, **typed(m.JobView))
def get_job(ctx: Ctx, job_id: str) -> dict[str, Any]:
    """A run or fork job as the store keeps it: ``queued``, ``running``, ``succeeded`` or
    ``failed`` (with ``error``), its attempts, the run of the current attempt and the runs
    of earlier attempts a lost worker left ``interrupted``."""
    from rewind.jobs import state as job_state

    row = job_state.get_job(ctx.store, job_id)
    if row is None or not access.current().can_see(row.job.args.get("created_by")):
        # another user's job answers like one that does not exist
        raise UnknownJob(f"no job {job_id!r}", "job ids come from POST /api/runs or /fork")
    return row.to_json()


@router.get("/runs/{run_id}", tags=["runs"], responses=LOOKUP_ERRORS, **typed(m.RunDetail))
def get_run(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """A run with its parent chain, children (forks) and artifacts."""
    run = ctx.resolve(run_id)
    who = access.current()
    ancestors = []
    for current in ctx.store.ancestors(run):
        if not who.can_see(current.created_by):
            break  # a fork of a run shared no longer: its chain stops here for this user
        ancestors.append(views.run_json(current))
    return live_run_json(ctx, run) | {
        "ancestors": ancestors,
        "children": [views.run_json(c) for c in visible(ctx.store.children(run.run_id))],
        # runs of the Burr sub-applications its nodes spawned, by node number
        "sub_runs": [
            {"number": position + 1, "runs": [views.run_json(c) for c in visible(subs)]}
            for position, subs in sorted(node_sub_runs(ctx.store, run.run_id).items())
        ],
        "artifacts": [artifact_json(run.run_id, a) for a in ctx.store.artifacts_of(run.run_id)],
        "live": ctx.manager.is_active(run.run_id),
        # A fork's code drift from its parent's recording (code changed, graph changes
        # accepted, or unchecked); None for a recorded run or one stored before graphs.
        "drift": graph.drift if (graph := ctx.store.run_graph(run.run_id)) else None,
    }


@router.get("/runs/{run_id}/graph", tags=["runs"], responses=LOOKUP_ERRORS, **typed(m.Graph))
def get_graph(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """The run's pipeline graph (nodes, edges) and node executions with status, cache
    outcome + reason, hashes, latency and tokens; poll it while the run is live."""
    run = ctx.resolve(run_id)
    job = ctx.manager.job(run.run_id)
    edges = ctx.store.edges_of(run.pipeline)
    if not edges:
        entry = ctx.pipelines.get(run.pipeline)
        if entry is not None:
            edges = entry.build().edges()
    finished = dict(job.finished) if job else {}
    running = job.running if job and job.state != "done" else None
    nodes = ctx.store.nodes_of(run.run_id)
    if run.status == "running" or (job is not None and job.state != "done"):
        run = ctx.manager.resolve(run.run_id)
    if run.status == "running" and running is None:
        # executed by another process (a `rewind run`, a worker): the store says which node
        running = progress.live_progress(ctx.store, run.run_id)["node"]
    out = views.graph_json(run, nodes, edges, live_finished=finished, running=running)
    out["run"] = live_run_json(ctx, run)
    return out
