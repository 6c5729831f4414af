"""API routes for the effect audit, the what-if grid and hash-stability runs.

``GET /api/runs/{id}/audit`` answers at once (it reads the store and fingerprints resources).
A grid (``POST /api/runs/{id}/grid``) or a stability run (``POST /api/runs/{id}/stability``)
forks the run several times, so like a run or a fork it is validated in the handler — nothing
is written for a bad request — then queued on :class:`~rewind.api.runner.ReportManager` and
answered ``202`` with a job id; ``GET /api/grids/{id}`` / ``GET /api/stability/{id}`` give the
job's status, its progress (one item per finished variant or sample) and, once completed, the
engine's report (:meth:`rewind.grid.GridReport.to_json`,
:meth:`rewind.stability.StabilityReport.to_json`).

The response models below document those shapes in OpenAPI; they allow extra fields, so a
report that grows a field is still served as is.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rewind.api import access, views
from rewind.api.context import Ctx, ServerContext, UnknownJob
from rewind.api.models import ApiModel, typed
from rewind.api.models import Override as OverrideJson
from rewind.api.requests import NodeRef
from rewind.api.runner import ReportJob
from rewind.api.schemas import SERVER_ERRORS, error_responses, response_header
from rewind.errors import InvalidOverride, RunBusy, UnknownRun
from rewind.replay import OutputOverride, Override, ParamOverride, Rewind, plan_fork
from rewind.store import RunRecord

if TYPE_CHECKING:
    from rewind.grid import VariantResult

MAX_VARIANTS = 32
"""Most variants one grid request may carry."""
MAX_GRID_WORKERS = 16
MAX_SAMPLES = 50
"""Largest K of a stability request."""


# -- request bodies ----------------------------------------------------------------------------


class VariantOverride(BaseModel):
    """One change: a param of a node at or after the fork node (``kind`` ``param``, the
    default), or a field the fork node wrote (``kind`` ``output``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["param", "output"] = "param"
    node: str = Field(min_length=1, max_length=200)
    param: str | None = Field(None, min_length=1, max_length=200, description="for kind param")
    field: str | None = Field(None, min_length=1, max_length=200, description="for kind output")
    value: Any = Field(description="the new value (any JSON)")


GridEffects = Annotated[
    Literal["recorded", "dry-run", "live"],
    Field(
        description="side-effecting calls of the variants: re-execute against a verified "
        "pre-state (live, default: a variant whose upstream changed publishes its own artifact), "
        "serve the recorded result (recorded: such a variant stops), or execute nothing (dry-run)"
    ),
]


class GridRequest(BaseModel):
    """Fork a finished run at one node once per override, concurrently."""

    model_config = ConfigDict(extra="forbid")
    at: NodeRef
    overrides: list[VariantOverride] = Field(
        min_length=1, max_length=MAX_VARIANTS, description="one change per variant (column)"
    )
    workers: int = Field(4, ge=1, le=MAX_GRID_WORKERS, description="variants run at once")
    effects: GridEffects = "live"
    restore: Literal["refuse", "replace"] = Field(
        "refuse",
        description="effects=live only: when restoring a pinned snapshot, refuse (default) or "
        "replace (delete) files the snapshot does not hold",
    )


class StabilityRequest(BaseModel):
    """Run a finished run's branch from one node K times live (caches bypassed) and measure
    how far the output hashes spread."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(5, ge=2, le=MAX_SAMPLES, description="number of samples (2–50)")
    from_node: NodeRef = 1
    override: VariantOverride | None = Field(None, description="one change every sample carries")
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="shorthand: sample the first LLM node from from_node on at this temperature "
        "(excludes override)",
    )


# -- response models (documentation; extra fields allowed) ---------------------------------------


class _Open(ApiModel):
    """A response model that keeps fields it does not declare."""

    model_config = ConfigDict(extra="allow")


class Fingerprint(_Open):
    """A resource fingerprint: content digest and epoch (None: not captured)."""

    digest: str | None
    epoch: str | None


class AuditResource(_Open):
    """One resource of an audited call: the recorded post-state and the reference's."""

    resource: str
    kind: str
    recorded: Fingerprint
    reference: str = Field(description="run <id>#<node>/<call>, current, or the run's next call")
    reference_post: Fingerprint
    epoch_delta: str
    status: Literal["match", "mismatch", "missing"]


class AuditVerdict(_Open):
    """The verdict of one side-effecting call."""

    run_id: str
    position: int = Field(description="0-based node position (node number = position + 1)")
    node: str
    call_index: int
    tool: str
    verdict: Literal["faithful", "divergent", "audit-incomplete", "not-re-executed"]
    resources: list[AuditResource]
    reason: str
    dependents: list[str] = Field(description='"<number>:<name>" of nodes depending on the call')
    output: str = Field(
        default="", description="output half of the pair: match, mismatch, or '' (no reference)"
    )
    differs: list[str] = Field(
        default_factory=list, description="for divergent: 'output' and/or 'post-state'"
    )


class AuditReportModel(_Open):
    """The effect-equivalence audit of a run; passes only when every call is faithful."""

    run_id: str
    against: str | None = Field(description="reference run id, 'current', or null")
    passed: bool = Field(description="a completed run whose every call is faithful, or vacuous")
    vacuous: bool = Field(description="completed, and no side-effecting call to audit")
    label: Literal["admissible", "vacuous", "not-admissible"]
    run_status: str
    note: str
    counts: dict[str, int]
    inherited_skipped: list[str]
    verdicts: list[AuditVerdict]


class LiveForkResource(_Open):
    """A resource a live fork would re-execute a side-effecting call against."""

    number: int = Field(description="1-based node number")
    node: str
    call_index: int
    tool: str
    resource: str | None = Field(description="null: the tool declares no resource")
    kind: str | None


class GridCell(_Open):
    """One variant's execution of one node (``null`` where the variant did not run it)."""

    output_hash: str | None
    short: str
    status: str = Field(description="equal, changed, only_b (new node) or failed")
    changed_fields: int | None
    outcome: str
    tokens: int


class GridRow(_Open):
    """One node of the matrix."""

    index: int
    name: str
    occurrence: int
    label: str
    parent_hash: str | None
    cells: list[GridCell | None]


class FirstDivergence(_Open):
    """The first row whose output differs from the parent."""

    index: int
    node: str | None


class GridVariant(_Open):
    """One column of the matrix."""

    index: int
    label: str
    override: dict[str, Any]
    run_id: str | None
    status: str
    error: str | None
    tokens: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_divergence: FirstDivergence | None
    artifacts: dict[str, str]
    changes_artifact: bool | None
    llm_requests: int
    llm_shared: int
    wall_ms: float


class GridParent(_Open):
    """What the grid's parent run spent and published."""

    tokens: int
    artifacts: dict[str, str]


class GridReportModel(_Open):
    """The N-way matrix of a what-if grid (rows = nodes, columns = variants)."""

    kind: Literal["grid"]
    run_id: str
    at: str
    at_number: int
    effects: str
    workers: int
    tokens: int
    batch: str | None = None
    wall_ms: float = Field(description="wall time of the whole grid (ms)")
    parent: GridParent
    new_llm_inputs: int = Field(
        description="LLM cache keys the variants needed that the parent did not"
    )
    llm_requests: int = Field(description="LLM requests the variants sent in total")
    changes_artifact: list[str] = Field(description="labels of variants that change the artifact")
    variants: list[GridVariant]
    rows: list[GridRow]


class FirstSpread(_Open):
    """The first node (branch order) that is not stable."""

    index: int
    label: str


class StabilityNode(_Open):
    """How one node of the branch behaved across the K samples."""

    index: int
    name: str
    occurrence: int
    label: str
    stable: bool
    distinct: int
    modal_hash: str | None
    modal_count: int
    modal_share: float
    completed: int
    parent_hash: str | None
    matches_parent: bool
    determinism: str
    hashes: list[str | None]


class StabilitySample(_Open):
    """One sample fork."""

    run_id: str
    status: str
    tokens: int
    error: str | None


class StabilityReportModel(_Open):
    """Per node: distinct output hashes, modal share, first spread node; stable share."""

    kind: Literal["stability"]
    run_id: str
    from_node: str
    from_number: int
    k: int
    override: OverrideJson | None
    batch: str | None = None
    wall_ms: float
    created_at: float | None = None
    path: str | None = None
    stable_share: float
    stable_nodes: int
    node_count: int
    first_spread: FirstSpread | None
    tokens: int
    samples: list[StabilitySample]
    nodes: list[StabilityNode]


class JobFork(_Open):
    """A variant or sample that finished."""

    index: int
    run_id: str | None
    status: str
    label: str
    error: str | None = Field(None, description="why the variant or sample failed")


class JobProgress(_Open):
    """Finished forks (variants or samples) out of the total."""

    done: int
    total: int
    forks: list[JobFork]


class JobError(_Open):
    """Why a job failed or was interrupted."""

    error: str
    message: str
    hint: str


class _Job(_Open):
    """A background job: what it does, how far it got, how it ended."""

    id: str
    kind: str
    run_id: str
    status: Literal["queued", "running", "completed", "failed", "interrupted"]
    request: dict[str, Any]
    progress: JobProgress
    error: JobError | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None


class GridJob(_Job):
    """A grid job: status, progress and (once completed) the report."""

    report: GridReportModel | None = None


class StabilityJob(_Job):
    """A stability job: status, progress and (once completed) the report."""

    report: StabilityReportModel | None = None


class JobList(_Open):
    """Jobs of this server."""

    jobs: list[_Job] = Field(description="newest first, without their reports")


def _doc(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "description": description}}


def _accepted_doc(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {
        202: {
            "model": model,
            "description": "accepted: queued (poll the Location)",
            "headers": {"Location": response_header("the job's URL")},
        }
    }


# -- validation ----------------------------------------------------------------------------------


def _finished_parent(ctx: ServerContext, run_id: str) -> RunRecord:
    parent = ctx.resolve(run_id)
    if parent.status in views.ACTIVE_STATUSES:
        raise RunBusy(
            f"run {parent.run_id} is still {parent.status}",
            "wait for its run_finished event (GET /api/runs/{id}/events), then try again",
        )
    return parent


def _override(body: VariantOverride, prefix: str) -> Override:
    """The engine override of one request override; :func:`plan_fork` checks it against the
    run.

    Raises:
        InvalidOverride (422) naming ``<prefix>.param|field``: the body mixes the two kinds.
    """
    if body.kind == "param":
        if body.param is None:
            raise InvalidOverride(
                f"{prefix}.param is required for a param override", field=f"{prefix}.param"
            )
        if body.field is not None:
            raise InvalidOverride(
                f"{prefix}.field belongs to an output override",
                "send kind",
                field=f"{prefix}.field",
            )
        return ParamOverride(body.node, body.param, body.value)
    if body.field is None:
        raise InvalidOverride(
            f"{prefix}.field is required for an output override", field=f"{prefix}.field"
        )
    if body.param is not None:
        raise InvalidOverride(
            f"{prefix}.param belongs to a param override", "drop it", field=f"{prefix}.param"
        )
    return OutputOverride(body.node, body.field, body.value)


def _accepted(job: ReportJob, path: str) -> JSONResponse:
    body = job.to_json() | {"links": {"self": path, "run": f"/api/runs/{job.run_id}"}}
    return JSONResponse(body, status_code=202, headers={"Location": path})


def _variant_progress(v: VariantResult) -> dict[str, Any]:
    return {
        "index": v.index,
        "run_id": v.run.run_id if v.run is not None else None,
        "status": v.status,
        "label": v.label,
        "error": v.error,
    }


# -- routes ------------------------------------------------------------------------------------


router = APIRouter(prefix="/api", responses=error_responses(*SERVER_ERRORS))
"""The audit, grid and stability routes of the API (mounted under ``/api``)."""


@router.get(
    "/runs/{run_id}/audit",
    tags=["audit"],
    summary="Effect-equivalence audit of a run",
    **typed(AuditReportModel),
    responses=_doc(AuditReportModel, "one verdict per side-effecting call")
    | error_responses(404, 409, 422),
)
def audit(
    ctx: Ctx,
    run_id: str,
    against: Annotated[
        str | None,
        Query(
            description="reference run (id or prefix), or 'current' for the resources' "
            "current state; default: the run's parent, else the current state",
            max_length=200,
        ),
    ] = None,
) -> dict[str, Any]:
    """One verdict per side-effecting call the run executed or served — ``faithful``,
    ``divergent``, ``audit-incomplete`` or ``not-re-executed`` — with the fingerprints
    compared, the epoch delta and the nodes depending on a call that is not faithful.
    ``passed`` only when every call is faithful (fails closed)."""
    from rewind.audit import CURRENT, audit_run

    run = ctx.resolve(run_id)
    if run.status == "queued":
        raise RunBusy(f"run {run.run_id} is still queued", "audit it once it has started")
    reference: str | None = None
    if against:
        if against == CURRENT:
            reference = CURRENT
        else:
            try:
                reference = ctx.resolve(against).run_id
            except UnknownRun as exc:
                raise UnknownRun(exc.message, exc.hint, field="against") from exc
    return audit_run(ctx.session(), run.run_id, reference).to_json()


@router.get(
    "/runs/{run_id}/live-fork-resources",
    tags=["audit"],
    summary="Resources a live fork would touch",
    response_model=list[LiveForkResource],
    responses=error_responses(404, 409, 422),
)
def live_resources(
    ctx: Ctx,
    run_id: str,
    at: Annotated[
        str, Query(description="fork node: name, name#k or 1-based number", max_length=200)
    ],
) -> list[dict[str, Any]]:
    """The resources a fork at ``at`` with ``effects=live`` would re-execute side-effecting
    calls against (its pre-state verified or its pinned snapshot restored): show them and
    ask for confirmation before a live fork."""
    from rewind.audit import live_fork_resources

    run = ctx.resolve(run_id)
    return live_fork_resources(ctx.session(), run.run_id, at)


@router.post(
    "/runs/{run_id}/grid",
    status_code=202,
    tags=["grid"],
    summary="Start a what-if grid",
    response_model=None,
    responses=_accepted_doc(GridJob) | error_responses(400, 403, 404, 409, 422),
)
def start_grid(ctx: Ctx, run_id: str, req: GridRequest) -> JSONResponse:
    """Fork a finished run at ``at`` once per override (variants run concurrently on
    ``workers`` threads; work they share is done once). Validated here — 404 unknown
    run/node, 409 run still running, 422 bad override naming ``overrides.<i>.<field>`` —
    then queued: answers 202 with the grid id; poll ``GET /api/grids/{grid_id}``."""
    parent = _finished_parent(ctx, run_id)
    rw = ctx.session()
    plans = [
        plan_fork(
            rw,
            parent.run_id,
            at=req.at,
            override=_override(o, f"overrides.{i}"),
            effects=req.effects,
            restore=req.restore,
            override_field=f"overrides.{i}",
        )
        for i, o in enumerate(req.overrides)
    ]
    nodes, idx = plans[0].nodes, plans[0].index
    overrides = [p.override for p in plans if p.override is not None]
    workers, effects, restore = req.workers, req.effects, req.restore

    def work(job: ReportJob, session: Rewind) -> dict[str, Any]:
        from rewind.grid import grid

        # With a task queue every variant is queued at once and executes on the queue's
        # workers (their processes bound the concurrency); else on `workers` threads here.
        run_fork = ctx.manager.remote_fork(restore=restore, created_by=session.created_by)
        report = grid(
            session,
            parent.run_id,
            at=idx + 1,
            overrides=overrides,
            max_workers=len(overrides) if run_fork else workers,
            effects=effects,
            on_variant=lambda v: job.add_progress(_variant_progress(v)),
            restore=restore,
            run_fork=run_fork,
        )
        return report.to_json()

    job_id = uuid.uuid4().hex
    request = {
        "at": nodes[idx].name,
        "at_number": idx + 1,
        "overrides": [o.to_json() for o in overrides],
        "workers": workers,
        "effects": effects,
        "restore": restore,
    }
    job = ctx.reports.submit(
        ReportJob(
            job_id,
            "grid",
            parent.run_id,
            request,
            len(overrides),
            work,
            created_by=access.current().name,
        )
    )
    return _accepted(job, f"/api/grids/{job_id}")


@router.get(
    "/grids",
    tags=["grid"],
    summary="List grid jobs",
    **typed(JobList),
    responses=_doc(JobList, "grid jobs of this server, newest first") | error_responses(404, 422),
)
def list_grids(
    ctx: Ctx,
    run_id: Annotated[str | None, Query(description="only grids of this run")] = None,
) -> dict[str, Any]:
    """Grid jobs this server accepted (kept in memory), newest first, without reports."""
    rid = ctx.resolve(run_id).run_id if run_id else None
    jobs = [j for j in ctx.reports.jobs("grid", rid) if access.current().can_see(j.created_by)]
    return {"jobs": [j.to_json(with_report=False) for j in jobs]}


@router.get(
    "/grids/{grid_id}",
    tags=["grid"],
    summary="A grid's status and matrix",
    **typed(GridJob),
    responses=_doc(GridJob, "status, progress and, once completed, the report")
    | error_responses(404, 422),
)
def get_grid(ctx: Ctx, grid_id: str) -> dict[str, Any]:
    """Status (``queued``, ``running``, ``completed``, ``failed``, ``interrupted``),
    progress (finished variants) and, once completed, the matrix: rows = nodes, columns =
    variants, each cell a short output hash and the number of fields changed vs the parent;
    the first divergence per variant and which variants change the artifact."""
    job = ctx.reports.get(grid_id, "grid")
    if job is None or not access.current().can_see(job.created_by):
        raise UnknownJob(f"no grid {grid_id!r} on this server", "list them: GET /api/grids")
    return job.to_json()


@router.post(
    "/runs/{run_id}/stability",
    status_code=202,
    tags=["stability"],
    summary="Start a hash-stability run",
    response_model=None,
    responses=_accepted_doc(StabilityJob) | error_responses(400, 403, 404, 409, 422),
)
def start_stability(ctx: Ctx, run_id: str, req: StabilityRequest) -> JSONResponse:
    """Run the branch from ``from_node`` K times live (LLM and tool caches bypassed; side
    effects never repeated: served from record, or logged as a dry run when their arguments
    spread), one sample after the other. Validated here — 404 unknown
    run/node, 409 run still running, 422 bad ``k`` (2–50) or override — then queued:
    answers 202 with the job id; poll ``GET /api/stability/{job_id}``."""
    from rewind.stability import plan_stability

    parent = _finished_parent(ctx, run_id)
    if req.temperature is not None and req.override is not None:
        raise InvalidOverride(
            "a stability run carries one change: temperature or override, not both",
            "drop one of them",
            field="temperature",
        )
    plan = plan_stability(
        ctx.session(),
        parent.run_id,
        req.from_node,
        _override(req.override, "override") if req.override is not None else None,
        req.temperature,
    )
    nodes, idx, override = plan.nodes, plan.index, plan.override
    k = req.k

    def work(job: ReportJob, session: Rewind) -> dict[str, Any]:
        from rewind.stability import stability

        def on_sample(i: int, run: RunRecord) -> None:
            job.add_progress(
                {
                    "index": i,
                    "run_id": run.run_id,
                    "status": run.status,
                    "label": f"sample {i + 1}",
                    "error": run.error,
                }
            )

        report = stability(
            session,
            parent.run_id,
            k=k,
            from_node=idx + 1,
            override=override,
            on_sample=on_sample,
            run_fork=ctx.manager.remote_fork(cache_mode="stability", created_by=session.created_by),
        )
        return report.to_json()

    job_id = uuid.uuid4().hex
    request = {
        "k": k,
        "from_node": nodes[idx].name,
        "from_number": idx + 1,
        "override": override.to_json() if override is not None else None,
        "temperature": req.temperature,
    }
    job = ctx.reports.submit(
        ReportJob(
            job_id,
            "stability",
            parent.run_id,
            request,
            k,
            work,
            created_by=access.current().name,
        )
    )
    return _accepted(job, f"/api/stability/{job_id}")


@router.get(
    "/stability",
    tags=["stability"],
    summary="List stability jobs",
    **typed(JobList),
    responses=_doc(JobList, "stability jobs of this server, newest first")
    | error_responses(404, 422),
)
def list_stability(
    ctx: Ctx,
    run_id: Annotated[str | None, Query(description="only jobs of this run")] = None,
) -> dict[str, Any]:
    """Stability jobs this server accepted (kept in memory), newest first, without reports
    (saved reports are also under the store's ``reports/`` folder)."""
    rid = ctx.resolve(run_id).run_id if run_id else None
    who = access.current()
    jobs = [j for j in ctx.reports.jobs("stability", rid) if who.can_see(j.created_by)]
    return {"jobs": [j.to_json(with_report=False) for j in jobs]}


@router.get(
    "/stability/{job_id}",
    tags=["stability"],
    summary="A stability run's status and report",
    **typed(StabilityJob),
    responses=_doc(StabilityJob, "status, progress and, once completed, the report")
    | error_responses(404, 422),
)
def get_stability(ctx: Ctx, job_id: str) -> dict[str, Any]:
    """Status, progress (finished samples) and, once completed, per node: distinct output
    hashes, the modal hash's share, whether it matches the recorded run; the first node
    where hashes spread and the overall stable share."""
    job = ctx.reports.get(job_id, "stability")
    if job is None or not access.current().can_see(job.created_by):
        raise UnknownJob(
            f"no stability job {job_id!r} on this server", "list them: GET /api/stability"
        )
    return job.to_json()
