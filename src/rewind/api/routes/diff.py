"""Diff routes: the field-level diff of two runs, and what a run cost against another."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from rewind.api import models as m
from rewind.api import views
from rewind.api.context import Ctx
from rewind.api.models import typed
from rewind.api.schemas import LOOKUP_ERRORS, SERVER_ERRORS, error_responses
from rewind.errors import InvalidOverride

router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))


@router.get("/runs/{run_id}/cost", tags=["diff"], responses=LOOKUP_ERRORS, **typed(m.Cost))
def cost(ctx: Ctx, run_id: str, against: str | None = None) -> dict[str, Any]:
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
    return views.cost_json(ctx.store, original, run)


@router.get("/diff", tags=["diff"], responses=LOOKUP_ERRORS, **typed(m.Diff))
def diff(
    ctx: Ctx,
    a: Annotated[str, Query(description="reference run (e.g. the parent)")],
    b: Annotated[str, Query(description="compared run (e.g. the fork)")],
) -> dict[str, Any]:
    """Field-level diff of two runs: aligned nodes, changed paths with old/new values, hash
    match, first divergence, token deltas, unified text diffs for long strings."""
    ra, rb = ctx.resolve(a), ctx.resolve(b)
    return ctx.session().diff(ra.run_id, rb.run_id).to_json()
