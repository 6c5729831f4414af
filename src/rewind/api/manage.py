"""Managing runs over HTTP: cancel, delete, live progress from the store, and the runs list's
grouping (job children under their job, sub-runs under their spawning run).

Routes (``/api``):

- ``POST /runs/{id}/cancel``: stop a queued or running run at its next node start; it ends
  ``cancelled`` (:mod:`rewind.progress`), whichever process executes it. A run whose process is
  gone is marked ``interrupted`` at once.
- ``DELETE /runs/{id}``: delete a run and its sub-runs for good, with ``rewind gc``'s rules
  (:func:`rewind.store.retention.delete_run`).
- ``GET /runs/{id}/progress``: the node a run executes now and its tokens so far, from the store.

Who may do what: a run the requester may not see answers 404 (as everywhere); cancel and delete
also need the run to be the requester's own (an admin: any run), else 403.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from enum import StrEnum
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import select

from rewind import progress
from rewind.api import access, views
from rewind.api.context import Ctx, ServerContext
from rewind.api.models import CancelAccepted, Progress, RunDeleted, typed
from rewind.api.runner import RunJob
from rewind.api.schemas import SERVER_ERRORS, error_responses
from rewind.errors import RewindError, RunBusy
from rewind.store import RunRecord, Store, schema
from rewind.store.retention import archived_run_ids, delete_run

__all__ = [
    "NotOwner",
    "NotRunning",
    "RunStatusFilter",
    "job_of",
    "live_run_json",
    "router",
    "run_tree",
    "unrecorded_runs",
]

JOB_KINDS = {"grid": "grid_batch", "stability": "stability_batch"}
"""Report jobs whose runs are grouped under the job: purpose → the config key of its batch id."""


class RunStatusFilter(StrEnum):
    """A run status the runs list filters on."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    interrupted = "interrupted"
    cancelled = "cancelled"


class NotOwner(RewindError):
    """The run is visible to the requester but not theirs to cancel or delete (403)."""


class NotRunning(RunBusy):
    """A cancel of a run that already finished (409)."""


def job_of(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report job a run (as :func:`views.run_json` shapes it) belongs to: ``{"id",
    "kind"}`` for a grid variant or stability sample, else None."""
    config = run.get("config") or {}
    kind = config.get("purpose")
    key = JOB_KINDS.get(kind) if isinstance(kind, str) else None
    batch = config.get(key) if key else None
    if not isinstance(batch, str) or not batch:
        return None
    return {"id": f"{kind}:{batch}", "kind": kind, "batch": batch}


def run_tree(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The runs list's tree, newest root first.

    A run item is ``{"run_id", "children": [forks], "jobs": [job items], "sub_runs": [run
    items]}``: a fork nests under its parent, a grid variant or stability sample under its job
    (``{"run_id": None, "job": {"id", "kind", "batch", "parent_run_id", "count", "statuses"},
    "children": [...]}``) under the job's parent run, a sub-run under the run that spawned it.
    A run whose parent (or spawning run) is not listed is a root; so is a job whose parent is
    not listed. Children are oldest first.
    """
    by_id: dict[str, dict[str, Any]] = {
        r["run_id"]: {"run_id": r["run_id"], "children": [], "jobs": [], "sub_runs": []}
        for r in runs
    }
    jobs: dict[str, dict[str, Any]] = {}
    roots: list[tuple[float, dict[str, Any]]] = []
    for r in sorted(runs, key=lambda r: r.get("created_at") or 0.0):
        item = by_id[r["run_id"]]
        spawner = r.get("spawning_run_id")
        parent = r.get("parent_run_id")
        job = job_of(r)
        if spawner in by_id and spawner != r["run_id"]:
            by_id[spawner]["sub_runs"].append(item)
        elif job is not None:
            group = jobs.get(job["id"])
            if group is None:
                group = jobs[job["id"]] = {
                    "run_id": None,
                    "job": job | {"parent_run_id": parent, "count": 0, "statuses": {}},
                    "children": [],
                }
                if parent in by_id and parent != r["run_id"]:
                    by_id[parent]["jobs"].append(group)
                else:
                    roots.append((r.get("created_at") or 0.0, group))
            group["children"].append(item)
            info = group["job"]
            info["count"] += 1
            status = str(r.get("status"))
            info["statuses"][status] = info["statuses"].get(status, 0) + 1
        elif parent in by_id and parent != r["run_id"]:
            by_id[parent]["children"].append(item)
        else:
            roots.append((r.get("created_at") or 0.0, item))
    roots.reverse()  # newest first, like the list
    return [item for _, item in roots]


def unrecorded_runs(
    store: Store,
    jobs: Sequence[RunJob],
    known: Collection[str],
    *,
    pipeline: str | None = None,
    statuses: Collection[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    q: str | None = None,
) -> list[RunRecord]:
    """Placeholders of the server's jobs that have no run row: queued, or failed before the
    run could start (so a failed job never vanishes from the runs list), newest first and
    matching the same filters as :meth:`Store.list_runs`."""
    candidates = [j for j in jobs if j.run_id not in known]
    if not candidates:
        return []
    t = schema.runs
    ids = [j.run_id for j in candidates]
    # States seen before the rows are read: a job that ends during the read is not "failed".
    states = {j.run_id: j.state for j in candidates}
    with store.read() as conn:
        present = {r[0] for r in conn.execute(select(t.c.run_id).where(t.c.run_id.in_(ids))).all()}
    present |= archived_run_ids(store, ids)  # archived by gc: gone from the list, not "failed"
    runs = (job.placeholder(states[job.run_id]) for job in candidates if job.run_id not in present)
    out = [
        run
        for run in runs
        if _listed(run, pipeline=pipeline, statuses=statuses, since=since, until=until, q=q)
    ]
    out.sort(key=lambda r: r.created_at, reverse=True)
    return out


def _listed(
    run: RunRecord,
    *,
    pipeline: str | None,
    statuses: Collection[str] | None,
    since: float | None,
    until: float | None,
    q: str | None,
) -> bool:
    """Whether ``run`` passes the runs list's filters (those of :meth:`Store.list_runs`)."""
    if (pipeline and run.pipeline != pipeline) or (statuses and run.status not in statuses):
        return False
    if (since is not None and run.created_at < since) or (
        until is not None and run.created_at >= until
    ):
        return False
    text = (q or "").lower()
    return not text or (
        run.run_id.lower().startswith(text)
        or any(
            text in field.lower() for field in (run.pipeline, run.fork_node or "", run.error or "")
        )
    )


def _own(run: RunRecord, action: str) -> None:
    who = access.current()
    if who.admin or (who.name is not None and who.name == run.created_by):
        return
    raise NotOwner(
        f"run {run.run_id[:12]} belongs to {run.created_by or 'no user'}: you may not {action} it",
        "only the run's owner or an admin may; ask them",
    )


def live_run_json(ctx: ServerContext, run: RunRecord) -> dict[str, Any]:
    """:func:`views.run_json` of a run, with the tokens spent so far when it is running (its
    row's totals are filled in only when it finishes)."""
    out = views.run_json(run)
    if run.status == "running":
        now = progress.live_progress(ctx.store, run.run_id)
        out |= {
            "prompt_tokens": now["prompt_tokens"],
            "completion_tokens": now["completion_tokens"],
            "tokens": now["tokens"],
        }
    return out


router = APIRouter(prefix="/api", tags=["runs"], responses=error_responses(*SERVER_ERRORS))
"""The routes of this module (see the module doc)."""


@router.post(
    "/runs/{run_id}/cancel",
    status_code=202,
    response_model=None,
    responses={202: {"model": CancelAccepted, "description": "cancel accepted"}}
    | error_responses(403, 404, 409, 422),
)
def cancel_run(ctx: Ctx, run_id: str) -> JSONResponse:
    """Cancel a queued or running run: it stops before its next node and ends
    ``cancelled`` (a node already executing finishes first). A run whose executing process
    is gone is marked ``interrupted`` at once. 409 when it already finished."""
    run = ctx.resolve(run_id)
    _own(run, "cancel")
    if run.is_sub_run:
        raise RunBusy(
            f"run {run.run_id[:12]} is a sub-run: it stops with the run that spawned it",
            f"cancel run {str(run.spawning_run_id)[:12]} instead",
        )
    who = access.current().name
    if run.status == "queued":
        progress.cancel_pending(run.run_id)
        if not ctx.store.run_exists(run.run_id):
            return _cancel_answer(run.run_id, "cancelling")
    if ctx.store.run_exists(run.run_id):
        if not ctx.manager.is_active(run.run_id) and ctx.store.reap_orphans([run.run_id]):
            return _cancel_answer(run.run_id, "interrupted")
        if progress.request_cancel(ctx.store, run.run_id, who):
            return _cancel_answer(run.run_id, "cancelling")
        run = ctx.store.get_run(run.run_id)
    raise NotRunning(
        f"run {run.run_id[:12]} already finished ({run.status})",
        "only a queued or running run can be cancelled",
    )


@router.delete("/runs/{run_id}", responses=error_responses(403, 404, 409, 422), **typed(RunDeleted))
async def delete(ctx: Ctx, run_id: str, dry_run: bool = False) -> dict[str, Any]:
    """Delete a run for good with ``rewind gc``'s rules: never a run a kept run descends
    from (delete its forks first: 409), its sub-runs go with it, a sub-run only with its
    spawning run (409), never a running run (409); then the blobs no row names any more.
    ``dry_run``: check and count only."""
    run = await run_in_threadpool(ctx.resolve, run_id)
    _own(run, "delete")
    if ctx.manager.is_active(run.run_id):
        raise progress_busy(run)
    waiting = [j.run_id for j in ctx.manager.active() if j.parent_run_id == run.run_id]
    if waiting:
        raise RunBusy(
            f"run {run.run_id[:12]} has a queued fork: {waiting[0][:12]}",
            "a run a kept run descends from is never deleted; wait for the fork, then "
            "delete it first",
        )
    if not dry_run:
        await run_in_threadpool(ctx.store.reap_orphans, [run.run_id])
    deleted = await run_in_threadpool(lambda: delete_run(ctx.store, run.run_id, dry_run=dry_run))
    if not dry_run:
        for rid in (deleted.run_id, *deleted.sub_runs):
            ctx.manager.forget(rid)
    return {"dry_run": dry_run} | deleted.to_json()


@router.get("/runs/{run_id}/progress", responses=error_responses(404, 422), **typed(Progress))
def run_progress(ctx: Ctx, run_id: str) -> dict[str, Any]:
    """What the store says of a run in flight, whoever executes it: the node executing now
    (null once the run finished), tokens of its committed nodes, a pending cancel."""
    run = ctx.resolve(run_id)
    if not ctx.store.run_exists(run.run_id):
        now: dict[str, Any] = {
            "node": None,
            "nodes": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "tokens": 0,
            "cancel_requested": None,
        }
    else:
        now = progress.live_progress(ctx.store, run.run_id)
    if run.status != "running":
        now["node"] = None
    return {
        "run_id": run.run_id,
        "status": run.status,
        "executing_here": ctx.manager.is_active(run.run_id),
    } | now


def progress_busy(run: RunRecord) -> RunBusy:
    """The error for deleting a run this server still executes."""
    return RunBusy(
        f"run {run.run_id[:12]} is still {run.status}", "cancel it first, then delete it"
    )


def _cancel_answer(run_id: str, status: str) -> JSONResponse:
    return JSONResponse(
        {"run_id": run_id, "status": status, "links": {"run": f"/api/runs/{run_id}"}},
        status_code=202,
    )
